// CPU kernels for reductions ("sum", "mean", "max", "var" on a contiguous [outer, r, inner] input and an
// [outer, inner] output), "softmax" and the norms. Float32/bfloat16/float16 go to the vectorized kernels in
// isa/; float64 and integer types take a plain scalar path (they are never hot in a diffusion model).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backends/cpu/reduction_kernels.h"
#include "backends/cpu/register_kernels.h"

namespace kiln::cpu_kernels {

namespace {

bool is_vectorized(DType d) {
  return d == float32 || d == bfloat16 || d == float16;
}

template <class T, class Out>
void reduce_scalar(ReduceKind kind, const T* x, Out* out, int64_t outer, int64_t r, int64_t inner,
                   int64_t correction) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < inner; ++c) {
      const T* p = x + o * r * inner + c;
      if (kind == ReduceKind::Max) {
        T m = p[0];
        for (int64_t i = 1; i < r; ++i) {
          const T v = p[i * inner];
          if constexpr (std::is_floating_point_v<T>) {
            if (std::isnan(v) || std::isnan(m)) {
              m = std::isnan(m) ? m : v;
              continue;
            }
          }
          m = v > m ? v : m;
        }
        out[o * inner + c] = static_cast<Out>(m);
        continue;
      }
      Acc s = 0;
      for (int64_t i = 0; i < r; ++i) s += static_cast<Acc>(p[i * inner]);
      if (kind == ReduceKind::Sum) {
        out[o * inner + c] = static_cast<Out>(s);
      } else if constexpr (std::is_floating_point_v<T>) {
        const double mean = static_cast<double>(s) / static_cast<double>(r);
        if (kind == ReduceKind::Mean) {
          out[o * inner + c] = static_cast<Out>(mean);
        } else {
          double m2 = 0;
          for (int64_t i = 0; i < r; ++i) m2 += (p[i * inner] - mean) * (p[i * inner] - mean);
          out[o * inner + c] =
              static_cast<Out>(m2 / std::max<double>(0.0, static_cast<double>(r - correction)));
        }
      }
    }
  }
}

template <ReduceKind kind>
void reduce_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& out = call.outputs[0];
  const int64_t outer = x.size(0), r = x.size(1), inner = x.size(2);
  const int64_t correction = kind == ReduceKind::Var ? call.attrs.get_int("correction") : 0;
  if (is_vectorized(x.dtype())) {
    KILN_ISA_CALL(reduce_float)(kind, x.dtype(), x.raw_data(), out.raw_data(), outer, r, inner, correction);
    return;
  }
  visit_dtype(x.dtype(), [&](auto xt) {
    using T = decltype(xt);
    if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>) {
      KILN_FAIL("internal: 16-bit float reduction reached the scalar path");
    } else if (out.dtype() == int64) {
      reduce_scalar(kind, static_cast<const T*>(x.raw_data()), static_cast<int64_t*>(out.raw_data()), outer,
                    r, inner, correction);
    } else {
      reduce_scalar(kind, static_cast<const T*>(x.raw_data()), static_cast<T*>(out.raw_data()), outer, r,
                    inner, correction);
    }
  });
}

void check_vectorized(const Tensor& x, const char* op) {
  KILN_CHECK(is_vectorized(x.dtype()),
             op << ": the cpu kernel supports float32, bfloat16 and float16, got " << dtype_name(x.dtype()));
}

const float* float_param(const Tensor& t) {
  return t.defined() ? static_cast<const float*>(t.raw_data()) : nullptr;
}

// inputs: x [rows, n] contiguous; outputs: y [rows, n] contiguous.
void softmax_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  check_vectorized(x, "softmax");
  KILN_ISA_CALL(softmax_rows)(x.dtype(), x.raw_data(), call.outputs[0].raw_data(), x.size(0), x.size(1));
}

// inputs: x [rows, n], weight and bias float32 [n] or undefined; attrs: eps.
void layer_norm_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  check_vectorized(x, "layer_norm");
  KILN_ISA_CALL(layer_norm_rows)
  (x.dtype(), x.raw_data(), float_param(call.inputs[1]), float_param(call.inputs[2]),
   call.outputs[0].raw_data(), x.size(0), x.size(1), static_cast<float>(call.attrs.get_float("eps")));
}

// inputs: x [rows, n], weight float32 [n] or undefined; attrs: eps, h_dtype (the rounding before the weight).
void rms_norm_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& y = call.outputs[0];
  check_vectorized(x, "rms_norm");
  check_vectorized(y, "rms_norm");
  const auto h_dtype = static_cast<DType>(call.attrs.get_int("h_dtype"));
  KILN_ISA_CALL(rms_norm_rows)
  (x.dtype(), x.raw_data(), float_param(call.inputs[1]), h_dtype, y.dtype(), y.raw_data(), x.size(0),
   x.size(1), static_cast<float>(call.attrs.get_float("eps")));
}

// inputs: x [N, C, spatial], weight and bias float32 [C] or undefined; attrs: groups, eps.
void group_norm_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  check_vectorized(x, "group_norm");
  KILN_ISA_CALL(group_norm)
  (x.dtype(), x.raw_data(), float_param(call.inputs[1]), float_param(call.inputs[2]),
   call.outputs[0].raw_data(), x.size(0), x.size(1), x.size(2), call.attrs.get_int("groups"),
   static_cast<float>(call.attrs.get_float("eps")));
}

}  // namespace

void register_reduction_kernels(runtime::KernelRegistry& registry) {
  registry.add("sum", DeviceType::CPU, reduce_kernel<ReduceKind::Sum>);
  registry.add("mean", DeviceType::CPU, reduce_kernel<ReduceKind::Mean>);
  registry.add("max", DeviceType::CPU, reduce_kernel<ReduceKind::Max>);
  registry.add("var", DeviceType::CPU, reduce_kernel<ReduceKind::Var>);
  registry.add("softmax", DeviceType::CPU, softmax_kernel);
  registry.add("layer_norm", DeviceType::CPU, layer_norm_kernel);
  registry.add("rms_norm", DeviceType::CPU, rms_norm_kernel);
  registry.add("group_norm", DeviceType::CPU, group_norm_kernel);
}

}  // namespace kiln::cpu_kernels
