// Sum, mean, max and variance over the middle extent of a contiguous [outer, r, inner] tensor.
// inner == 1 reduces along rows (vectorized along the row); inner > 1 reduces columns (vectorized across
// columns, walking r). Float32 accumulation with double block partials for every storage type.
#include <algorithm>
#include <vector>

#include "backends/cpu/isa/reduction_row.h"
#include "backends/cpu/reduction_kernels.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

// Parallelise only above this many input elements: below it thread start-up costs more than the work.
constexpr int64_t kGrain = 1 << 15;

double finish(ReduceKind kind, double acc, int64_t r, int64_t correction) {
  if (kind == ReduceKind::Mean) return acc / static_cast<double>(r);
  if (kind == ReduceKind::Var) return acc / std::max<double>(0.0, static_cast<double>(r - correction));
  return acc;
}

// One row: the finished statistic.
template <class T>
double reduce_row(ReduceKind kind, const T* x, int64_t r, int64_t correction) {
  switch (kind) {
    case ReduceKind::Max:
      return row_max(x, r);
    case ReduceKind::Sum:
    case ReduceKind::Mean:
      return finish(kind, row_sum(x, r, Identity{}), r, correction);
    case ReduceKind::Var: {
      const float mean = static_cast<float>(row_sum(x, r, Identity{}) / static_cast<double>(r));
      const double m2 = row_sum(x, r, [mean](f32x16 v) {
        const f32x16 d = v - mean;
        return d * d;
      });
      return finish(kind, m2, r, correction);
    }
  }
  return 0;
}

// A single long row (a full reduction): split the row across threads, then combine.
template <class T>
double reduce_long_row(ReduceKind kind, const T* x, int64_t r, int64_t correction) {
  const int threads = omp_get_max_threads();
  const int64_t chunk = ((r + threads - 1) / threads + kLanes - 1) / kLanes * kLanes;
  std::vector<double> part(static_cast<size_t>(threads), 0.0);
  auto for_chunks = [&](auto&& fn) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < threads; ++t) {
      const int64_t begin = t * chunk, end = std::min(r, begin + chunk);
      part[static_cast<size_t>(t)] = begin < end ? fn(x + begin, end - begin) : std::nan("");
    }
  };
  if (kind == ReduceKind::Max) {
    for_chunks([](const T* p, int64_t n) { return static_cast<double>(row_max(p, n)); });
    double m = -HUGE_VAL;
    for (int t = 0; t < threads && t * chunk < r; ++t) {
      const double v = part[static_cast<size_t>(t)];
      if (std::isnan(v)) return v;
      m = std::max(m, v);
    }
    return m;
  }
  auto sum_parts = [&] {
    double s = 0;
    for (int t = 0; t < threads && t * chunk < r; ++t) s += part[static_cast<size_t>(t)];
    return s;
  };
  for_chunks([](const T* p, int64_t n) { return row_sum(p, n, Identity{}); });
  const double total = sum_parts();
  if (kind != ReduceKind::Var) return finish(kind, total, r, correction);
  const float mean = static_cast<float>(total / static_cast<double>(r));
  for_chunks([mean](const T* p, int64_t n) {
    return row_sum(p, n, [mean](f32x16 v) {
      const f32x16 d = v - mean;
      return d * d;
    });
  });
  return finish(kind, sum_parts(), r, correction);
}

// Columns [c0, c0 + width) of one [r, inner] slab: out[c] = reduction over r of x[:, c].
// Float32 accumulation over blocks of kColBlock rows, double across blocks (as row_sum does).
constexpr int64_t kColTile = 256;
constexpr int64_t kColBlock = 256;

template <class T>
void reduce_columns(ReduceKind kind, const T* x, T* out, int64_t r, int64_t inner, int64_t c0, int64_t width,
                    int64_t correction) {
  const int64_t vecs = width / kLanes;
  const int rest = static_cast<int>(width - vecs * kLanes);
  auto load_cols = [&](const T* p, int64_t v, float fill) {
    return v < vecs ? load(p + v * kLanes) : load_partial(p + v * kLanes, rest, fill);
  };
  const int64_t nvec = vecs + (rest ? 1 : 0);
  f32x16 acc[kColTile / kLanes];
  double total[kColTile];

  if (kind == ReduceKind::Max) {
    i32x16 nan[kColTile / kLanes];
    for (int64_t v = 0; v < nvec; ++v) {
      acc[v] = splat(-__builtin_inff());
      nan[v] = i32x16{};
    }
    for (int64_t i = 0; i < r; ++i) {
      const T* row = x + i * inner + c0;
      for (int64_t v = 0; v < nvec; ++v) {
        const f32x16 a = load_cols(row, v, -__builtin_inff());
        nan[v] |= a != a;
        acc[v] = vmax(acc[v], a);
      }
    }
    for (int64_t c = 0; c < width; ++c)
      out[c0 + c] =
          from_float<T>(nan[c / kLanes][c % kLanes] ? __builtin_nanf("") : acc[c / kLanes][c % kLanes]);
    return;
  }

  // Column sums of f(x), finished into total[].
  auto column_sums = [&](auto f) {
    for (int64_t c = 0; c < width; ++c) total[c] = 0.0;
    for (int64_t i0 = 0; i0 < r; i0 += kColBlock) {
      const int64_t i1 = std::min(r, i0 + kColBlock);
      for (int64_t v = 0; v < nvec; ++v) acc[v] = f32x16{};
      for (int64_t i = i0; i < i1; ++i) {
        const T* row = x + i * inner + c0;
        for (int64_t v = 0; v < nvec; ++v) acc[v] += f(load_cols(row, v, 0.0f), v);
      }
      for (int64_t c = 0; c < width; ++c) total[c] += acc[c / kLanes][c % kLanes];
    }
  };
  column_sums([](f32x16 a, int64_t) { return a; });
  if (kind == ReduceKind::Var) {
    f32x16 mean[kColTile / kLanes];
    for (int64_t c = 0; c < width; ++c) mean[c / kLanes][c % kLanes] = static_cast<float>(total[c] / r);
    column_sums([&mean](f32x16 a, int64_t v) {
      const f32x16 d = a - mean[v];
      return d * d;
    });
  }
  for (int64_t c = 0; c < width; ++c)
    out[c0 + c] = from_float<T>(static_cast<float>(finish(kind, total[c], r, correction)));
}

template <class T>
void reduce_typed(ReduceKind kind, const T* x, T* out, int64_t outer, int64_t r, int64_t inner,
                  int64_t correction) {
  const bool parallel = outer * r * inner >= kGrain;
  if (inner == 1) {
    if (outer < omp_get_max_threads() && parallel) {
      for (int64_t o = 0; o < outer; ++o)
        out[o] = from_float<T>(static_cast<float>(reduce_long_row(kind, x + o * r, r, correction)));
      return;
    }
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t o = 0; o < outer; ++o)
      out[o] = from_float<T>(static_cast<float>(reduce_row(kind, x + o * r, r, correction)));
    return;
  }
  const int64_t tiles = (inner + kColTile - 1) / kColTile;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t task = 0; task < outer * tiles; ++task) {
    const int64_t o = task / tiles, c0 = (task % tiles) * kColTile;
    reduce_columns(kind, x + o * r * inner, out + o * inner, r, inner, c0, std::min(kColTile, inner - c0),
                   correction);
  }
}

}  // namespace

void reduce_float(ReduceKind kind, DType dtype, const void* x, void* out, int64_t outer, int64_t r,
                  int64_t inner, int64_t correction) {
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_typed(kind, static_cast<const T*>(x), static_cast<T*>(out), outer, r, inner, correction);
  });
}

}  // namespace kiln::cpu_kernels::KILN_ISA
