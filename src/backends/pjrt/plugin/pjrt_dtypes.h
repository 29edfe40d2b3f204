// Kiln's dtypes as PJRT buffer element types, both ways.
#pragma once

#include "kiln/core/dtype.h"
#include "xla/pjrt/c/pjrt_c_api.h"

namespace kiln::pjrt {

// Every Kiln dtype has a PJRT type (bool is PRED, one byte per element as in Kiln).
PJRT_Buffer_Type to_pjrt(DType dtype);
// The Kiln dtype of a PJRT type; throws naming `what` and the PJRT type when Kiln has none (u32, f8, ...).
DType from_pjrt(PJRT_Buffer_Type type, const char* what);

}  // namespace kiln::pjrt
