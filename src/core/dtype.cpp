#include "kiln/core/dtype.h"

#include "kiln/core/error.h"

namespace kiln {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Float64:
    case DType::Int64:
      return 8;
    case DType::Float32:
    case DType::Int32:
      return 4;
    case DType::BFloat16:
    case DType::Float16:
    case DType::Int16:
      return 2;
    case DType::Int8:
    case DType::UInt8:
    case DType::Bool:
      return 1;
  }
  KILN_FAIL("dtype_size: unknown dtype " << static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return "float32";
    case DType::BFloat16:
      return "bfloat16";
    case DType::Float16:
      return "float16";
    case DType::Float64:
      return "float64";
    case DType::Int64:
      return "int64";
    case DType::Int32:
      return "int32";
    case DType::Int16:
      return "int16";
    case DType::Int8:
      return "int8";
    case DType::UInt8:
      return "uint8";
    case DType::Bool:
      return "bool";
  }
  return "unknown";
}

bool is_floating(DType d) {
  return d == DType::Float32 || d == DType::BFloat16 || d == DType::Float16 || d == DType::Float64;
}

bool is_integral(DType d) {
  return d == DType::Int64 || d == DType::Int32 || d == DType::Int16 || d == DType::Int8 || d == DType::UInt8;
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "fp32") return DType::Float32;
  if (name == "bf16" || name == "bfloat16") return DType::BFloat16;
  if (name == "f16" || name == "float16" || name == "fp16" || name == "half") return DType::Float16;
  if (name == "f64" || name == "float64") return DType::Float64;
  if (name == "i64" || name == "int64") return DType::Int64;
  if (name == "i32" || name == "int32") return DType::Int32;
  if (name == "i16" || name == "int16") return DType::Int16;
  if (name == "i8" || name == "int8") return DType::Int8;
  if (name == "u8" || name == "uint8") return DType::UInt8;
  if (name == "bool") return DType::Bool;
  KILN_FAIL("unknown dtype '" << name
                              << "': expected one of f32, bf16, f16, f64, i64, i32, i16, i8, u8, bool");
}

namespace {
int float_rank(DType d) {
  switch (d) {
    case DType::Float16:
    case DType::BFloat16:
      return 1;
    case DType::Float32:
      return 2;
    case DType::Float64:
      return 3;
    default:
      return 0;
  }
}
int int_rank(DType d) {
  switch (d) {
    case DType::Bool:
      return 0;
    case DType::UInt8:
    case DType::Int8:
      return 1;
    case DType::Int16:
      return 2;
    case DType::Int32:
      return 3;
    case DType::Int64:
      return 4;
    default:
      return -1;
  }
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (fa && fb) {
    const int ra = float_rank(a), rb = float_rank(b);
    if (ra == rb) return DType::Float32;  // bfloat16 with float16
    return ra > rb ? a : b;
  }
  if (a == DType::Bool) return b;
  if (b == DType::Bool) return a;
  // uint8 with int8 promotes to int16 in torch.
  if ((a == DType::UInt8 && b == DType::Int8) || (a == DType::Int8 && b == DType::UInt8)) return DType::Int16;
  return int_rank(a) > int_rank(b) ? a : b;
}

}  // namespace kiln
