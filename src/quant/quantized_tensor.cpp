#include "kiln/quant/quantized_tensor.h"

namespace kiln::quant {

QuantizedTensor QuantizedTensor::rows(int64_t start, int64_t end) const {
  KILN_CHECK(defined() && !shape.empty(), "QuantizedTensor::rows: the tensor is undefined or a scalar");
  KILN_CHECK(0 <= start && start <= end && end <= shape[0],
             "QuantizedTensor::rows: rows [" << start << ", " << end << ") out of range for dimension 0 of "
                                             << type_name(type) << " " << shape_str(shape));
  // Block rows per index of the first dimension (1 for a matrix).
  const int64_t per = shape[0] == 0 ? 0 : blocks.size(0) / shape[0];
  Shape s = shape;
  s[0] = end - start;
  return {blocks.narrow(0, start * per, (end - start) * per), type, s};
}

Tensor QuantizedTensor::dequantize() const {
  KILN_CHECK(defined(), "QuantizedTensor::dequantize: the tensor is undefined");
  Tensor out = Tensor::empty(shape, float32);
  const int64_t k = shape.empty() ? 1 : shape.back();
  const Tensor src = blocks.contiguous();
  const uint8_t* in = src.data<uint8_t>();
  float* dst = out.data<float>();
  const int64_t rows = src.size(0), bytes = src.size(1);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(type, in + r * bytes, dst + r * k, k);
  return out;
}

}  // namespace kiln::quant
