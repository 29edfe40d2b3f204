// Rotary position embedding on rows of D elements: out = x * cos + rotate(x) * sin in float32, where rotate
// pairs (2i, 2i+1) -> (-x[2i+1], x[2i]) (Interleaved) or halves (x1, x2) -> (-x2, x1) (RotateHalf).
#include "backends/cpu/isa/reduction_row.h"
#include "backends/cpu/reduction_kernels.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

template <class T>
void rope_interleaved_row(const T* x, const float* c, const float* s, T* y, int64_t d) {
#ifndef __clang__
  const i32x16 swap = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
#endif
  const f32x16 sign = {-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1};
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    const f32x16 v = load(x + i);
#ifdef __clang__  // the fuzz build's compiler: the same permutation as a constant shuffle
    const f32x16 rot =
        __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14) * sign;
#else
    const f32x16 rot = __builtin_shuffle(v, swap) * sign;
#endif
    store(y + i, v * load(c + i) + rot * load(s + i));
  }
  for (; i < d; i += 2) {  // d is even, so pairs never straddle the vector tail
    const float a = to_float(x[i]), b = to_float(x[i + 1]);
    y[i] = from_float<T>(a * c[i] + (-b) * s[i]);
    y[i + 1] = from_float<T>(b * c[i + 1] + a * s[i + 1]);
  }
}

template <class T>
void rope_rotate_half_row(const T* x, const float* c, const float* s, T* y, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; i += kLanes) {
    const int n = half - i < kLanes ? static_cast<int>(half - i) : kLanes;
    const auto ld = [n](const auto* p) { return n == kLanes ? load(p) : load_partial(p, n); };
    const f32x16 x1 = ld(x + i), x2 = ld(x + half + i);
    const f32x16 lo = x1 * ld(c + i) + (-x2) * ld(s + i);
    const f32x16 hi = x2 * ld(c + half + i) + x1 * ld(s + half + i);
    if (n == kLanes) {
      store(y + i, lo);
      store(y + half + i, hi);
    } else {
      store_partial(y + i, lo, n);
      store_partial(y + half + i, hi, n);
    }
  }
}

template <class T>
void rope_typed(RopeStyle style, const T* x, const RopeShape& sh, const float* cos, const float* sin, T* y) {
  const int64_t rows = sh.batch * sh.heads * sh.seq;
  // Rows in the order they lie in memory: in a head-split view of a [B, S, H, D] projection (q and k as
  // attention blocks make them), heads are the inner dimension. Walking one head's positions instead jumps a
  // page per row, out of the prefetchers' reach: bf16 ran at 7 GB/s that way.
  const bool heads_inner = sh.x_strides[1] < sh.x_strides[2];
#pragma omp parallel for schedule(static) if (rows * sh.dim >= (1 << 14))
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / (sh.seq * sh.heads);
    const int64_t s = heads_inner ? row / sh.heads % sh.seq : row % sh.seq;
    const int64_t h = heads_inner ? row % sh.heads : row / sh.seq % sh.heads;
    const T* xr = x + b * sh.x_strides[0] + h * sh.x_strides[1] + s * sh.x_strides[2];
    T* yr = y + b * sh.y_strides[0] + h * sh.y_strides[1] + s * sh.y_strides[2];
    const float* c = cos + s * sh.dim;
    const float* sn = sin + s * sh.dim;
    if (style == RopeStyle::Interleaved)
      rope_interleaved_row(xr, c, sn, yr, sh.dim);
    else
      rope_rotate_half_row(xr, c, sn, yr, sh.dim);
  }
}

}  // namespace

void rope(RopeStyle style, DType dtype, const void* x, const RopeShape& shape, const float* cos,
          const float* sin, void* y) {
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    rope_typed(style, static_cast<const T*>(x), shape, cos, sin, static_cast<T*>(y));
  });
}

}  // namespace kiln::cpu_kernels::KILN_ISA
