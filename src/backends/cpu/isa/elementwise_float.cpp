// Elementwise runs whose math is float32: inputs of float32, bfloat16, float16 (or bool, read as 0/1) are
// widened exactly to float32, the op is computed once in float32 and the result rounded once (RNE) to the
// output dtype, as torch does on CPU. A run is processed in blocks that stay in L1: each operand is gathered
// into a float buffer (or used in place when it already is contiguous float32), the op runs on whole
// vectors, and the result is scattered back with conversion.
#include <cmath>

#include "backends/cpu/elementwise_op.h"
#include "backends/cpu/isa/elementwise_math.h"
#include "backends/cpu/isa/vec.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

constexpr int kBlock = 512;  // floats per operand buffer: 2 KiB, a few buffers fit in L1 with room to spare

float read_one(const char* p, DType dtype) {
  switch (dtype) {
    case DType::Float32: {
      float v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    case DType::BFloat16: {
      bf16_t v;
      std::memcpy(&v, p, sizeof v);
      return bf16_to_f32(v);
    }
    case DType::Float16: {
      f16_t v;
      std::memcpy(&v, p, sizeof v);
      return f16_to_f32(v);
    }
    case DType::Bool:
      return *p != 0 ? 1.0f : 0.0f;
    default:
      __builtin_unreachable();
  }
}

template <class T>
void widen_contiguous(const T* __restrict src, float* __restrict dst, int n) {
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) store(dst + i, load(src + i));
  if (i < n) store_partial(dst + i, load_partial(src + i, n - i), n - i);
}

// Elements [0, n) of `in` as floats: a pointer into the operand itself when it is contiguous float32,
// otherwise `buf` filled with the widened values.
const float* gather(const EwOperand& in, int64_t start, int n, float* buf) {
  const char* p = in.data + start * in.stride;
  if (in.stride == 0) {
    const f32x16 v = splat(read_one(p, in.dtype));
    for (int i = 0; i < n; i += kLanes) store(buf + i, v);  // buffers hold whole vectors
    return buf;
  }
  const int64_t size = static_cast<int64_t>(dtype_size(in.dtype));
  if (in.stride == size) {
    switch (in.dtype) {
      case DType::Float32:
        return reinterpret_cast<const float*>(p);
      case DType::BFloat16:
        widen_contiguous(reinterpret_cast<const bf16_t*>(p), buf, n);
        return buf;
      case DType::Float16:
        widen_contiguous(reinterpret_cast<const f16_t*>(p), buf, n);
        return buf;
      default:
        break;
    }
  }
  for (int i = 0; i < n; ++i) buf[i] = read_one(p + i * in.stride, in.dtype);
  return buf;
}

template <class T>
void narrow_contiguous(const float* __restrict src, T* __restrict dst, int n) {
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) store(dst + i, load(src + i));
  if (i < n) store_partial(dst + i, load_partial(src + i, n - i), n - i);
}

void scatter(const float* src, char* out, int64_t stride, DType dtype, int n) {
  const int64_t size = static_cast<int64_t>(dtype_size(dtype));
  if (stride == size) {
    switch (dtype) {
      case DType::Float32:
        std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
        return;
      case DType::BFloat16:
        narrow_contiguous(src, reinterpret_cast<bf16_t*>(out), n);
        return;
      case DType::Float16:
        narrow_contiguous(src, reinterpret_cast<f16_t*>(out), n);
        return;
      case DType::Bool:
        for (int i = 0; i < n; ++i) out[i] = src[i] != 0.0f;
        return;
      default:
        __builtin_unreachable();
    }
  }
  for (int i = 0; i < n; ++i) {
    char* p = out + i * stride;
    switch (dtype) {
      case DType::Float32:
        std::memcpy(p, &src[i], sizeof(float));
        break;
      case DType::BFloat16: {
        const bf16_t v = f32_to_bf16(src[i]);
        std::memcpy(p, &v, sizeof v);
        break;
      }
      case DType::Float16: {
        const f16_t v = f32_to_f16(src[i]);
        std::memcpy(p, &v, sizeof v);
        break;
      }
      case DType::Bool:
        *p = src[i] != 0.0f;
        break;
      default:
        __builtin_unreachable();
    }
  }
}

// y[i] = f(a[i]) over whole vectors and one partial tail. y may be a buffer or the output itself.
template <class F>
void map1(const float* a, float* y, int n, F f) {
  int i = 0;
  // Two independent vectors per iteration: the long dependency chains of exp/tanh/erf overlap.
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const f32x16 r0 = f(load(a + i)), r1 = f(load(a + i + kLanes));
    store(y + i, r0);
    store(y + i + kLanes, r1);
  }
  for (; i + kLanes <= n; i += kLanes) store(y + i, f(load(a + i)));
  if (i < n) store_partial(y + i, f(load_partial(a + i, n - i)), n - i);
}
template <class F>
void map2(const float* a, const float* b, float* y, int n, F f) {
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) store(y + i, f(load(a + i), load(b + i)));
  if (i < n) store_partial(y + i, f(load_partial(a + i, n - i), load_partial(b + i, n - i)), n - i);
}
template <class F>
void map3(const float* a, const float* b, const float* c, float* y, int n, F f) {
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) store(y + i, f(load(a + i), load(b + i), load(c + i)));
  if (i < n)
    store_partial(
        y + i, f(load_partial(a + i, n - i), load_partial(b + i, n - i), load_partial(c + i, n - i)), n - i);
}

inline f32x16 mask_to_float(i32x16 m) {
  return m ? splat(1.0f) : splat(0.0f);
}

// pow with the shortcuts torch takes for common scalar exponents, so results round the same way.
void pow_scalar(const float* a, float* y, int n, double exponent) {
  if (exponent == 2.0) return map1(a, y, n, [](f32x16 x) { return x * x; });
  if (exponent == 3.0) return map1(a, y, n, [](f32x16 x) { return x * x * x; });
  if (exponent == 0.5) return map1(a, y, n, [](f32x16 x) { return vsqrt(x); });
  if (exponent == -0.5) return map1(a, y, n, [](f32x16 x) { return ew_rsqrt(x); });
  if (exponent == -1.0) return map1(a, y, n, [](f32x16 x) { return 1.0f / x; });
  if (exponent == -2.0) return map1(a, y, n, [](f32x16 x) { return 1.0f / (x * x); });
  const float e = static_cast<float>(exponent);
  for (int i = 0; i < n; ++i) y[i] = std::pow(a[i], e);
}

void compute(EwOp op, const EwParams& prm, const float* const* in, float* y, int n) {
  const float* a = in[0];
  const float* b = in[1];
  switch (op) {
    case EwOp::Add:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return x + z; });
    case EwOp::Sub:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return x - z; });
    case EwOp::Mul:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return x * z; });
    case EwOp::Div:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return x / z; });
    case EwOp::Maximum:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return ew_maximum(x, z); });
    case EwOp::Minimum:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return ew_minimum(x, z); });
    case EwOp::Pow:
      for (int i = 0; i < n; ++i) y[i] = std::pow(a[i], b[i]);
      return;
    case EwOp::Eq:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return mask_to_float(x == z); });
    case EwOp::Ne:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return mask_to_float(x != z); });
    case EwOp::Lt:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return mask_to_float(x < z); });
    case EwOp::Le:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return mask_to_float(x <= z); });
    case EwOp::Gt:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return mask_to_float(x > z); });
    case EwOp::Ge:
      return map2(a, b, y, n, [](f32x16 x, f32x16 z) { return mask_to_float(x >= z); });
    case EwOp::Where:
      return map3(a, b, in[2], y, n, [](f32x16 c, f32x16 x, f32x16 z) { return c != 0.0f ? x : z; });
    case EwOp::Neg:
      return map1(a, y, n, [](f32x16 x) { return -x; });
    case EwOp::Abs:
      return map1(a, y, n, [](f32x16 x) { return vabs(x); });
    case EwOp::Exp:
      return map1(a, y, n, [](f32x16 x) { return vexp(x); });
    case EwOp::Log:
      return map1(a, y, n, [](f32x16 x) { return vlog(x); });
    case EwOp::Sqrt:
      return map1(a, y, n, [](f32x16 x) { return vsqrt(x); });
    case EwOp::Rsqrt:
      return map1(a, y, n, [](f32x16 x) { return ew_rsqrt(x); });
    case EwOp::Sin:
      for (int i = 0; i < n; ++i) y[i] = std::sin(a[i]);
      return;
    case EwOp::Cos:
      for (int i = 0; i < n; ++i) y[i] = std::cos(a[i]);
      return;
    case EwOp::Tanh:
      return map1(a, y, n, [](f32x16 x) { return vtanh(x); });
    case EwOp::Sigmoid:
      return map1(a, y, n, [](f32x16 x) { return vsigmoid(x); });
    case EwOp::Silu:
      return map1(a, y, n, [](f32x16 x) { return act_silu(x); });
    case EwOp::Gelu:
      return map1(a, y, n, [](f32x16 x) { return act_gelu(x); });
    case EwOp::GeluTanh:
      return map1(a, y, n, [](f32x16 x) { return act_gelu_tanh(x); });
    case EwOp::QuickGelu:
      return map1(a, y, n, [](f32x16 x) { return act_quick_gelu(x); });
    case EwOp::Square:
      return map1(a, y, n, [](f32x16 x) { return x * x; });
    case EwOp::Clamp: {
      const f32x16 lo = splat(static_cast<float>(prm.lo)), hi = splat(static_cast<float>(prm.hi));
      return map1(a, y, n, [lo, hi](f32x16 x) { return ew_clamp_hi(ew_clamp_lo(x, lo), hi); });
    }
    case EwOp::PowScalar:
      return pow_scalar(a, y, n, prm.exponent);
  }
}

}  // namespace

void ew_float_run(EwOp op, const EwParams& params, const EwOperand* inputs, char* out, int64_t out_stride,
                  DType out_dtype, int64_t n) {
  alignas(64) float bufs[3][kBlock];
  alignas(64) float result[kBlock];
  const int arity = ew_arity(op);
  const bool direct_out = out_dtype == DType::Float32 && out_stride == static_cast<int64_t>(sizeof(float));
  for (int64_t start = 0; start < n; start += kBlock) {
    const int len = static_cast<int>(n - start < kBlock ? n - start : kBlock);
    const float* in[3] = {nullptr, nullptr, nullptr};
    for (int k = 0; k < arity; ++k) in[k] = gather(inputs[k], start, len, bufs[k]);
    float* y = direct_out ? reinterpret_cast<float*>(out + start * out_stride) : result;
    compute(op, params, in, y, len);
    if (!direct_out) scatter(result, out + start * out_stride, out_stride, out_dtype, len);
  }
}

}  // namespace kiln::cpu_kernels::KILN_ISA
