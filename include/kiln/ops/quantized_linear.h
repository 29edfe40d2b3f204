// torch.nn.functional.linear with a weight kept in a ggml block format (GGUF Q8_0, Q4_K, ...) or in fp8
// (safetensors' F8_E4M3 / F8_E5M2, kiln/quant/storage_type.h): the weight stays quantized in memory and is
// expanded panel by panel (a few hundred output rows at a time) into the compute dtype right before the GEMM
// uses it, so no dequantized copy of the whole weight ever exists. The result equals linear(x,
// dequantized_weight.to(x.dtype()), bias): a bfloat16 x multiplies the weight rounded to bfloat16 (as
// diffusers' GGUFLinear does with compute_dtype=bfloat16), a float32 x the exact dequantized values;
// accumulation is float32.
#pragma once

#include "kiln/core/tensor.h"
#include "kiln/quant/quantized_tensor.h"

namespace kiln {

// x [..., K] float32 or bfloat16; weight [N, K] quantized (traits(type).is_quantized); optional bias [N] in
// x's dtype or float32
// -> [..., N] in x's dtype.
Tensor linear(const Tensor& x, const quant::QuantizedTensor& weight, const Tensor& bias = {});

}  // namespace kiln
