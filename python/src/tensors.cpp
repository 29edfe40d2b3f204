#include "tensors.h"

#include <cstring>
#include <vector>

#include "kiln/core/error.h"

namespace nb = nanobind;

namespace kiln::python {

namespace {

nb::dlpack::dtype dlpack_dtype(DType d) {
  switch (d) {
    case DType::Float32:
      return nb::dtype<float>();
    case DType::Float16:
      return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::BFloat16:
      return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case DType::UInt8:
      return nb::dtype<uint8_t>();
    case DType::Int64:
      return nb::dtype<int64_t>();
    default:
      KILN_FAIL("no array dtype for " << dtype_name(d));
  }
}

DType kiln_dtype(nb::dlpack::dtype d, const char* what) {
  const auto code = static_cast<nb::dlpack::dtype_code>(d.code);
  if (d.lanes == 1 && code == nb::dlpack::dtype_code::Float && d.bits == 32) return float32;
  if (d.lanes == 1 && code == nb::dlpack::dtype_code::Float && d.bits == 16) return float16;
  if (d.lanes == 1 && code == nb::dlpack::dtype_code::Bfloat && d.bits == 16) return bfloat16;
  if (d.lanes == 1 && code == nb::dlpack::dtype_code::UInt && d.bits == 8) return uint8;
  KILN_FAIL(what << ": expected float32, bfloat16, float16 or uint8 values, got a dtype of code "
                 << static_cast<int>(d.code) << " and " << static_cast<int>(d.bits) << " bits");
}

}  // namespace

nb::ndarray<> to_array(const Tensor& t, bool widen_bfloat16) {
  // Python reads host memory: a device's tensor (latents given to a callback or returned) is copied back.
  const Tensor host = t.to(cpu);
  auto* held = new Tensor(widen_bfloat16 && host.dtype() == bfloat16 ? host.to(float32) : host.contiguous());
  void* data = held->host_data();  // waits for the work that writes it
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(held->shape().begin(), held->shape().end());
  return nb::ndarray<>(data, shape.size(), shape.data(), owner, nullptr, dlpack_dtype(held->dtype()));
}

Tensor from_array(const AnyArray& array, const char* what) {
  const DType dtype = kiln_dtype(array.dtype(), what);
  Shape shape;
  for (size_t i = 0; i < array.ndim(); ++i) shape.push_back(static_cast<int64_t>(array.shape(i)));
  Tensor out = Tensor::empty(shape, dtype);
  const size_t element = dtype_size(dtype);
  char* dst = static_cast<char*>(out.raw_data());
  const char* src = static_cast<const char*>(array.data());
  // Any strides (element units in DLPack): copy element by element when not contiguous.
  bool contiguous = true;
  int64_t expected = 1;
  for (size_t i = array.ndim(); i-- > 0;) {
    if (array.shape(i) != 1 && array.stride(i) != expected) contiguous = false;
    expected *= static_cast<int64_t>(array.shape(i));
  }
  const int64_t n = out.numel();
  if (contiguous) {
    std::memcpy(dst, src, static_cast<size_t>(n) * element);
    return out;
  }
  std::vector<int64_t> index(array.ndim(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t offset = 0;
    for (size_t i = 0; i < array.ndim(); ++i) offset += index[i] * array.stride(i);
    std::memcpy(dst + k * element, src + offset * static_cast<int64_t>(element), element);
    for (size_t i = array.ndim(); i-- > 0;) {
      if (++index[i] < static_cast<int64_t>(array.shape(i))) break;
      index[i] = 0;
    }
  }
  return out;
}

}  // namespace kiln::python
