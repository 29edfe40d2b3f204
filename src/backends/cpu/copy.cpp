// "copy": writes inputs[0] (already broadcast to the output's shape) into outputs[0], converting dtype.
#include <cstring>
#include <type_traits>

#include "backends/cpu/isa_dispatch.h"
#include "backends/cpu/register_kernels.h"
#include "backends/cpu/strided_loop.h"

namespace kiln::cpu_kernels {

KILN_ISA_DECLARE(bool, cast_contiguous, (const void* src, DType from, void* dst, DType to, int64_t n));

namespace {

// The dtypes whose contiguous conversions cast_contiguous (isa/cast.cpp) vectorizes.
template <class T>
inline constexpr bool is_vector_float =
    std::is_same_v<T, float> || std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>;

template <class From, class To>
inline To convert(From v) {
  if constexpr (std::is_same_v<From, To>) {
    return v;
  } else if constexpr (std::is_same_v<To, bf16_t> && std::is_same_v<From, float>) {
    return f32_to_bf16(v);
  } else if constexpr (std::is_same_v<To, float> && std::is_same_v<From, bf16_t>) {
    return bf16_to_f32(v);
  } else if constexpr (std::is_same_v<To, f16_t> && std::is_same_v<From, float>) {
    return f32_to_f16(v);
  } else if constexpr (std::is_same_v<To, float> && std::is_same_v<From, f16_t>) {
    return f16_to_f32(v);
  } else if constexpr (std::is_same_v<To, bool>) {
    return scalar_to_double(v) != 0.0;
  } else if constexpr (std::is_floating_point_v<To> || std::is_same_v<To, bf16_t> ||
                       std::is_same_v<To, f16_t>) {
    // Through double: exact for every source except int64 beyond 2^53, where torch rounds the same way.
    if constexpr (std::is_same_v<To, bf16_t> || std::is_same_v<To, f16_t>) {
      return scalar_from_double<To>(static_cast<float>(scalar_to_double(v)));
    } else {
      return static_cast<To>(scalar_to_double(v));
    }
  } else {
    // To an integer: truncate toward zero like torch's .to(int).
    if constexpr (std::is_same_v<From, bf16_t> || std::is_same_v<From, f16_t>) {
      return static_cast<To>(scalar_to_double(v));
    } else {
      return static_cast<To>(v);
    }
  }
}

template <class From, class To>
void copy_run(const char* src, char* dst, int64_t n, int64_t src_stride, int64_t dst_stride) {
  if (src_stride == sizeof(From) && dst_stride == sizeof(To)) {
    if constexpr (std::is_same_v<From, To>) {
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(To));
    } else if constexpr (is_vector_float<From> && is_vector_float<To>) {
      KILN_ISA_CALL(cast_contiguous)(src, dtype_of_v<From>, dst, dtype_of_v<To>, n);
    } else {
      const From* __restrict s = reinterpret_cast<const From*>(src);
      To* __restrict d = reinterpret_cast<To*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = convert<From, To>(s[i]);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    From v;
    std::memcpy(&v, src + i * src_stride, sizeof(From));
    const To r = convert<From, To>(v);
    std::memcpy(dst + i * dst_stride, &r, sizeof(To));
  }
}

void copy_kernel(const runtime::OpCall& call) {
  const Tensor& src = call.inputs[0];
  const Tensor& dst = call.outputs[0];
  visit_dtype(src.dtype(), [&](auto from) {
    visit_dtype(dst.dtype(), [&](auto to) {
      using From = decltype(from);
      using To = decltype(to);
      for_each_run<2>(dst.shape(), {static_cast<char*>(dst.raw_data()), static_cast<char*>(src.raw_data())},
                      {byte_strides(dst), byte_strides(src)},
                      [](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> s) {
                        copy_run<From, To>(p[1], p[0], n, s[1], s[0]);
                      });
    });
  });
}

}  // namespace

void register_copy_kernels(runtime::KernelRegistry& registry) {
  registry.add("copy", DeviceType::CPU, copy_kernel);
}

}  // namespace kiln::cpu_kernels
