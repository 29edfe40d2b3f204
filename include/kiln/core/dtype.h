// Element types. The names mirror torch (kiln::float32, kiln::bfloat16, ...) so diffusers users feel at home.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/core/half.h"

namespace kiln {

enum class DType : uint8_t { Float32, BFloat16, Float16, Float64, Int64, Int32, Int16, Int8, UInt8, Bool };

inline constexpr DType float32 = DType::Float32;
inline constexpr DType bfloat16 = DType::BFloat16;
inline constexpr DType float16 = DType::Float16;
inline constexpr DType float64 = DType::Float64;
inline constexpr DType int64 = DType::Int64;
inline constexpr DType int32 = DType::Int32;
inline constexpr DType int16 = DType::Int16;
inline constexpr DType int8 = DType::Int8;
inline constexpr DType uint8 = DType::UInt8;
inline constexpr DType boolean = DType::Bool;

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "float32", "bfloat16", ...
bool is_floating(DType dtype);
bool is_integral(DType dtype);  // excludes Bool
// Parses "f32", "float32", "bf16", "bfloat16", "f16", "float16", ...; throws kiln::Error naming the choices.
DType parse_dtype(std::string_view name);

// torch's promotion for two tensor operands: bool < integers < floating; mixed 16-bit floats go to float32.
DType promote_types(DType a, DType b);

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct dtype_of<bf16_t> {
  static constexpr DType value = DType::BFloat16;
};
template <>
struct dtype_of<f16_t> {
  static constexpr DType value = DType::Float16;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::Float64;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::Int64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::Int32;
};
template <>
struct dtype_of<int16_t> {
  static constexpr DType value = DType::Int16;
};
template <>
struct dtype_of<int8_t> {
  static constexpr DType value = DType::Int8;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::UInt8;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::Bool;
};
template <class T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

// Calls f(T{}) with the C++ type stored for `dtype`.
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f(float{});
    case DType::BFloat16:
      return f(bf16_t{});
    case DType::Float16:
      return f(f16_t{});
    case DType::Float64:
      return f(double{});
    case DType::Int64:
      return f(int64_t{});
    case DType::Int32:
      return f(int32_t{});
    case DType::Int16:
      return f(int16_t{});
    case DType::Int8:
      return f(int8_t{});
    case DType::UInt8:
      return f(uint8_t{});
    case DType::Bool:
      return f(bool{});
  }
  __builtin_unreachable();
}

// Scalar conversion through float/double with the same rounding as the cast kernels.
template <class To>
To scalar_from_double(double v) {
  if constexpr (std::is_same_v<To, bf16_t>)
    return f32_to_bf16(static_cast<float>(v));
  else if constexpr (std::is_same_v<To, f16_t>)
    return f32_to_f16(static_cast<float>(v));
  else if constexpr (std::is_same_v<To, bool>)
    return v != 0.0;
  else
    return static_cast<To>(v);
}
template <class From>
double scalar_to_double(From v) {
  if constexpr (std::is_same_v<From, bf16_t>)
    return bf16_to_f32(v);
  else if constexpr (std::is_same_v<From, f16_t>)
    return f16_to_f32(v);
  else
    return static_cast<double>(v);
}

}  // namespace kiln
