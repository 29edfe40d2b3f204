#include "backends/pjrt/plugin/pjrt_dtypes.h"

#include <utility>

#include "kiln/core/error.h"

namespace kiln::pjrt {
namespace {

constexpr std::pair<DType, PJRT_Buffer_Type> kTypes[] = {
    {DType::Float32, PJRT_Buffer_Type_F32}, {DType::BFloat16, PJRT_Buffer_Type_BF16},
    {DType::Float16, PJRT_Buffer_Type_F16}, {DType::Float64, PJRT_Buffer_Type_F64},
    {DType::Int64, PJRT_Buffer_Type_S64},   {DType::Int32, PJRT_Buffer_Type_S32},
    {DType::Int16, PJRT_Buffer_Type_S16},   {DType::Int8, PJRT_Buffer_Type_S8},
    {DType::UInt8, PJRT_Buffer_Type_U8},    {DType::Bool, PJRT_Buffer_Type_PRED}};

}  // namespace

PJRT_Buffer_Type to_pjrt(DType dtype) {
  for (const auto& [d, t] : kTypes)
    if (d == dtype) return t;
  KILN_FAIL("PJRT: dtype " << dtype_name(dtype) << " has no PJRT element type");
}

DType from_pjrt(PJRT_Buffer_Type type, const char* what) {
  for (const auto& [d, t] : kTypes)
    if (t == type) return d;
  KILN_FAIL(
      what
      << ": PJRT element type " << int(type)
      << " (PJRT_Buffer_Type) has no Kiln dtype; Kiln has f32, bf16, f16, f64, i64, i32, i16, i8, u8, bool");
}

}  // namespace kiln::pjrt
