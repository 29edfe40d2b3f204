// Tensor: a typed, strided view of a reference-counted Storage on a Device.
// View operations (reshape of contiguous data, permute, slice, expand, ...) share storage; ops that compute
// live in kiln/ops.h. Reading values on the host (data(), to_vector(), item()) waits for the device stream.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/shape.h"
#include "kiln/core/storage.h"

namespace kiln {

class Tensor {
 public:
  Tensor() = default;  // undefined tensor; defined() is false
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype);

  // ---- creation (values are written on the host; for another device, then copied there)
  static Tensor empty(const Shape& shape, DType dtype = float32, Device device = cpu);
  static Tensor zeros(const Shape& shape, DType dtype = float32, Device device = cpu);
  static Tensor full(const Shape& shape, double value, DType dtype = float32, Device device = cpu);
  // Copies `count` elements of `dtype` from host memory.
  static Tensor from_blob(const void* data, const Shape& shape, DType dtype, Device device = cpu);
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
    KILN_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
               "Tensor::from_vector: " << values.size() << " values do not fill shape " << shape_str(shape));
    return from_blob(values.data(), shape, dtype_of_v<T>);
  }
  // 0..n-1 as int64, like torch.arange(n).
  static Tensor arange(int64_t n, DType dtype = int64);

  // ---- metadata
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  Device device() const;
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  std::string str() const;  // "bfloat16[2, 3] on cpu"

  // ---- views (no copy)
  Tensor view(const Shape& shape) const;     // requires a compatible layout; -1 infers one dimension
  Tensor reshape(const Shape& shape) const;  // view when possible, otherwise a contiguous copy
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;  // python-style clamping
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;                // strict bounds
  Tensor select(int64_t dim, int64_t index) const;                                // drops `dim`
  Tensor expand(const Shape& shape) const;  // broadcast size-1 dims (stride 0); -1 keeps a dim
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;

  // ---- copies
  Tensor contiguous() const;  // self when already contiguous
  Tensor clone() const;
  Tensor to(DType dtype) const;  // self when already that dtype
  Tensor to(Device device) const;
  void copy_(const Tensor& src);  // src is broadcast to this shape and cast to this dtype

  // ---- host access (waits for the device; CPU only)
  // Pointer to element 0 of this view; requires dtype T. Waits for queued work on the device.
  template <class T>
  T* data() const {
    KILN_CHECK(dtype_of_v<T> == dtype_, "Tensor::data: tensor is " << dtype_name(dtype_) << ", requested "
                                                                   << dtype_name(dtype_of_v<T>));
    return static_cast<T*>(host_data());
  }
  // The values, copied to the host (from any device).
  template <class T>
  std::vector<T> to_vector() const {
    Tensor c = to(cpu).to(dtype_of_v<T>).contiguous();
    const T* p = c.data<T>();
    return std::vector<T>(p, p + c.numel());
  }
  // Single element as double (any dtype, any device); requires numel() == 1.
  double item() const;
  // Pointer to element 0 of this view, whatever the dtype; waits like data().
  void* host_data() const;

  // Pointer to element 0 without waiting: for kernels running on the stream.
  void* raw_data() const {
    return static_cast<char*>(storage_->data()) + static_cast<size_t>(offset_) * element_size();
  }

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Strides strides_;
  int64_t offset_ = 0;
  DType dtype_ = float32;
};

}  // namespace kiln
