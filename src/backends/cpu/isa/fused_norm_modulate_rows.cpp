// norm_modulate's row kernel: adaLN's norm(x) * (1 + scale) + shift in one parallel loop over rows. Each
// row is read from memory once for its statistics (it then sits in L1/L2, a DiT row being 6-12 KB) and
// once more from cache to write the result, so the tensor crosses DRAM once each way instead of the four
// round trips of the unfused norm, add, mul and add.
#include <cmath>

#include "backends/cpu/fused_kernels.h"
#include "backends/cpu/isa/reduction_row.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

// Below this many elements the OpenMP fork costs more than the work.
constexpr int64_t kGrain = 1 << 14;

template <class T>
void norm_modulate_typed(bool layer_norm, const T* x, const float* scale, const float* shift, T* y,
                         int64_t rows, int64_t n, int64_t block_rows, float eps) {
#pragma omp parallel for schedule(static) if (rows * n >= kGrain)
  for (int64_t row = 0; row < rows; ++row) {
    const T* __restrict xr = x + row * n;
    T* __restrict yr = y + row * n;
    const float* __restrict sc = scale + (row / block_rows) * n;
    const float* __restrict sh = shift + (row / block_rows) * n;
    float mean = 0.0f, rstd;
    if (layer_norm) {
      // Two sums rather than E[x^2] - mean^2: the centred sum keeps its precision for rows with a large mean.
      mean = static_cast<float>(row_sum(xr, n, Identity{}) / static_cast<double>(n));
      const double var = row_sum(xr, n, [mean](f32x16 v) {
        const f32x16 d = v - mean;
        return d * d;
      });
      rstd = 1.0f / std::sqrt(static_cast<float>(var / static_cast<double>(n)) + eps);
    } else {
      const double ms = row_sum(xr, n, [](f32x16 v) { return v * v; });
      rstd = 1.0f / std::sqrt(static_cast<float>(ms / static_cast<double>(n)) + eps);
    }
    // (x - mean) * rstd * (1 + scale) + shift in float32, as (x - mean) * ((1 + scale) * rstd) + shift with
    // one fma: the centred difference is kept (exact near the mean), the factors merged.
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      // The next row is fetched while this one is written: its statistics pass then finds it in cache
      // instead of waiting on DRAM with nothing else in flight.
      __builtin_prefetch(xr + n + i);
      store(yr + i, vfma(load(xr + i) - mean, (1.0f + load(sc + i)) * rstd, load(sh + i)));
    }
    if (i < n) {
      const int rest = static_cast<int>(n - i);
      store_partial(yr + i,
                    vfma(load_partial(xr + i, rest) - mean, (1.0f + load_partial(sc + i, rest)) * rstd,
                         load_partial(sh + i, rest)),
                    rest);
    }
  }
}

}  // namespace

void norm_modulate_rows(bool layer_norm, DType dtype, const void* x, const float* scale, const float* shift,
                        void* y, int64_t rows, int64_t n, int64_t block_rows, float eps) {
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    norm_modulate_typed(layer_norm, static_cast<const T*>(x), scale, shift, static_cast<T*>(y), rows, n,
                        block_rows, eps);
  });
}

}  // namespace kiln::cpu_kernels::KILN_ISA
