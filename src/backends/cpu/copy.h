// Copies between CPU tensors of one shape, converting dtype: the "copy" kernel's body (copy.cpp), also used
// by kernels that lay an operand out afresh before reading it.
#pragma once

#include "kiln/core/tensor.h"

namespace kiln::cpu_kernels {

// dst = src (same shape, any strides, any dtypes; dst must not overlap src).
void copy_tensor(const Tensor& src, const Tensor& dst);

// Whether copying src into dst's layout reads src across its rows: dst's rows walk src with a stride while
// another dimension of src is contiguous (a permuted view). Such a read, element by element, fetches each
// source cache line once per element; copy_tensor moves it in tiles instead.
bool copy_reads_transposed(const Tensor& src, const Tensor& dst);

}  // namespace kiln::cpu_kernels
