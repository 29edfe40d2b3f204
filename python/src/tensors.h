// Kiln tensors to and from Python arrays through DLPack (numpy, torch, or anything that speaks it): outputs
// are handed out without a copy (the array keeps the tensor's storage alive), inputs are copied into Kiln's
// memory (a Python-owned buffer must not be freed by a thread that does not hold the GIL).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "kiln/core/tensor.h"

namespace kiln::python {

using AnyArray = nanobind::ndarray<nanobind::ro, nanobind::device::cpu>;

// A contiguous view of `t` (waiting for its pending work) as an array owning a reference to its storage.
// `widen_bfloat16`: bfloat16 values become a float32 copy (for numpy, which has no bfloat16).
nanobind::ndarray<> to_array(const Tensor& t, bool widen_bfloat16 = false);
// A copy of a CPU array of float32, bfloat16, float16 or uint8 values; `what` names the argument in errors.
Tensor from_array(const AnyArray& array, const char* what);

}  // namespace kiln::python
