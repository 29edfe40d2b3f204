// A tensor kept in a ggml block format: its raw blocks as a uint8 tensor [rows, row_bytes] (rows =
// numel / shape.back()), its storage type and its logical shape. Linear layers compute on such weights
// without expanding them (kiln/ops/quantized_linear.h).
#pragma once

#include "kiln/core/tensor.h"
#include "kiln/quant/storage_type.h"

namespace kiln::quant {

struct QuantizedTensor {
  Tensor blocks;  // uint8 [rows, row_bytes]; undefined when the tensor is not stored quantized
  StorageType type = StorageType::F32;
  Shape shape;  // the logical shape ([out_features, in_features] for a weight)

  bool defined() const { return blocks.defined(); }
  // Rows [start, end) along the first logical dimension (whole rows of blocks; a view, no copy).
  QuantizedTensor rows(int64_t start, int64_t end) const;
  // The values as a float32 tensor of `shape`.
  Tensor dequantize() const;
};

}  // namespace kiln::quant
