// Row-wise softmax, layer norm, RMS norm and group norm. Each row is read once for its statistics (the row
// then sits in L1/L2) and once more to write the result; nothing the size of the tensor is allocated.
#include <cmath>
#include <vector>

#include "backends/cpu/isa/reduction_row.h"
#include "backends/cpu/reduction_kernels.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

constexpr int64_t kGrain = 1 << 14;

// Applies y[i] = f(x[i], i) over a row, 16 lanes at a time; f gets the lane vector and the element index.
template <class Tx, class Ty, class F>
inline void map_row(const Tx* x, Ty* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(y + i, f(load(x + i), i, kLanes));
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    store_partial(y + i, f(load_partial(x + i, rest), i, rest), rest);
  }
}

// Per-channel float32 parameters as lanes, or `fill` when absent.
inline f32x16 param(const float* p, int64_t i, int count, float fill) {
  if (!p) return splat(fill);
  return count == kLanes ? load(p + i) : load_partial(p + i, count, fill);
}

template <class T>
void softmax_typed(const T* x, T* y, int64_t rows, int64_t n) {
#pragma omp parallel if (rows * n >= kGrain)
  {
    // float32 scratch for exp(x - max) when the output is 16-bit, so that the result is rounded only once.
    std::vector<float> scratch(std::is_same_v<T, float> ? 0 : static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const T* xr = x + row * n;
      T* yr = y + row * n;
      float* e = std::is_same_v<T, float> ? reinterpret_cast<float*>(yr) : scratch.data();
      const float m = row_max(xr, n);
      f32x16 s0{}, s1{};
      int64_t i = 0;
      for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
        const f32x16 e0 = vexp(load(xr + i) - m), e1 = vexp(load(xr + i + kLanes) - m);
        store(e + i, e0);
        store(e + i + kLanes, e1);
        s0 += e0;
        s1 += e1;
      }
      for (; i < n; i += kLanes) {
        const int rest = n - i < kLanes ? static_cast<int>(n - i) : kLanes;
        // Missing lanes read as -inf so that they add exp(-inf) = 0.
        const f32x16 ev = vexp(load_partial(xr + i, rest, -__builtin_inff()) - m);
        store_partial(e + i, ev, rest);
        s0 += ev;
      }
      const float inv = 1.0f / reduce_add(s0 + s1);
      map_row(e, yr, n, [inv](f32x16 v, int64_t, int) { return v * inv; });
    }
  }
}

template <class T>
void layer_norm_typed(const T* x, const float* w, const float* b, T* y, int64_t rows, int64_t n, float eps) {
#pragma omp parallel for schedule(static) if (rows * n >= kGrain)
  for (int64_t row = 0; row < rows; ++row) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    const float mean = static_cast<float>(row_sum(xr, n, Identity{}) / static_cast<double>(n));
    const float var = static_cast<float>(row_sum(xr, n,
                                                 [mean](f32x16 v) {
                                                   const f32x16 d = v - mean;
                                                   return d * d;
                                                 }) /
                                         static_cast<double>(n));
    const float rstd = 1.0f / std::sqrt(var + eps);
    // (x - mean) * rstd rather than x * rstd - mean * rstd: the subtraction is exact for x near the mean, so
    // rows with a large mean keep their precision.
    map_row(xr, yr, n, [=](f32x16 v, int64_t i, int count) {
      return (v - mean) * rstd * param(w, i, count, 1.0f) + param(b, i, count, 0.0f);
    });
  }
}

// Short rows of 16-bit floats go 16 at a time: their lane partials are added up for all 16 rows at once
// (reduce_add_16, the same sums to the bit as row_sum's for a row of one block), where the per-row lane sum,
// a chain of 16 dependent additions, took most of the time of rows such as SD3.5's and FLUX.1's per-head q/k
// norms (64 and 128 elements): bf16 rows of 64 ran 37% faster (bench_reduction). Float32 rows of 64 ran
// 20-40% slower that way (their row pass is cheap enough for one row's sum to overlap the next row's work),
// so they stay one at a time, as do rows past kShortRow, whose lane sum is a small part of their time.
constexpr int64_t kShortRow = 512;

template <class Tx, class Th, class Ty>
void rms_norm_typed(const Tx* x, const float* w, Ty* y, int64_t rows, int64_t n, float eps) {
  const auto square = [](f32x16 v) { return v * v; };
  const auto normalize = [=](int64_t row, double sum) {
    const float ms = static_cast<float>(sum / static_cast<double>(n));
    const float r = 1.0f / std::sqrt(ms + eps);
    map_row(x + row * n, y + row * n, n, [=](f32x16 v, int64_t i, int count) {
      const f32x16 h = round_to<Th>(v * r);
      return w ? h * param(w, i, count, 1.0f) : h;
    });
  };
  const int64_t groups = !std::is_same_v<Tx, float> && n <= kShortRow ? rows / kLanes : 0;
  const int64_t items = groups + (rows - groups * kLanes);
#pragma omp parallel for schedule(static) if (rows * n >= kGrain)
  for (int64_t item = 0; item < items; ++item) {
    if (item < groups) {
      const int64_t row0 = item * kLanes;
      f32x16 partials[kLanes];
      for (int r = 0; r < kLanes; ++r) partials[r] = block_partial(x + (row0 + r) * n, n, square);
      const f32x16 sums = reduce_add_16(partials);
      for (int r = 0; r < kLanes; ++r) normalize(row0 + r, static_cast<double>(sums[r]));
    } else {
      const int64_t row = groups * kLanes + (item - groups);
      normalize(row, row_sum(x + row * n, n, square));
    }
  }
}

template <class T>
void group_norm_typed(const T* x, const float* w, const float* b, T* y, int64_t batch, int64_t channels,
                      int64_t spatial, int64_t groups, float eps) {
  const int64_t per_group = channels / groups;
  const int64_t count = per_group * spatial;
#pragma omp parallel for schedule(dynamic, 1) if (batch * channels * spatial >= kGrain)
  for (int64_t task = 0; task < batch * groups; ++task) {
    const int64_t base = task * count;  // (n * channels + g * per_group) * spatial
    const float mean = static_cast<float>(row_sum(x + base, count, Identity{}) / static_cast<double>(count));
    const float var = static_cast<float>(row_sum(x + base, count,
                                                 [mean](f32x16 v) {
                                                   const f32x16 d = v - mean;
                                                   return d * d;
                                                 }) /
                                         static_cast<double>(count));
    const float rstd = 1.0f / std::sqrt(var + eps);
    for (int64_t c = 0; c < per_group; ++c) {
      const int64_t channel = (task % groups) * per_group + c;
      const float scale = rstd * (w ? w[channel] : 1.0f);
      const float shift = b ? b[channel] : 0.0f;
      const int64_t off = base + c * spatial;
      map_row(x + off, y + off, spatial, [=](f32x16 v, int64_t, int) { return (v - mean) * scale + shift; });
    }
  }
}

}  // namespace

void softmax_rows(DType dtype, const void* x, void* y, int64_t rows, int64_t n) {
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    softmax_typed(static_cast<const T*>(x), static_cast<T*>(y), rows, n);
  });
}

void layer_norm_rows(DType dtype, const void* x, const float* w, const float* b, void* y, int64_t rows,
                     int64_t n, float eps) {
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    layer_norm_typed(static_cast<const T*>(x), w, b, static_cast<T*>(y), rows, n, eps);
  });
}

void rms_norm_rows(DType x_dtype, const void* x, const float* w, DType h_dtype, DType y_dtype, void* y,
                   int64_t rows, int64_t n, float eps) {
  visit_float(x_dtype, [&](auto xt) {
    visit_float(h_dtype, [&](auto ht) {
      visit_float(y_dtype, [&](auto yt) {
        using Tx = decltype(xt);
        using Th = decltype(ht);
        using Ty = decltype(yt);
        rms_norm_typed<Tx, Th, Ty>(static_cast<const Tx*>(x), w, static_cast<Ty*>(y), rows, n, eps);
      });
    });
  });
}

void group_norm(DType dtype, const void* x, const float* w, const float* b, void* y, int64_t batch,
                int64_t channels, int64_t spatial, int64_t groups, float eps) {
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    group_norm_typed(static_cast<const T*>(x), w, b, static_cast<T*>(y), batch, channels, spatial, groups,
                     eps);
  });
}

}  // namespace kiln::cpu_kernels::KILN_ISA
