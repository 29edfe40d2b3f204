#include "backends/pjrt/host_transfer.h"

#include <cstring>
#include <vector>

#include "backends/pjrt/device_array.h"
#include "backends/pjrt/device_memory.h"
#include "backends/pjrt/pjrt_backend.h"
#include "backends/pjrt/pjrt_kernels.h"
#include "backends/pjrt/stablehlo/storage_views.h"
#include "runtime/op_call.h"

namespace kiln::pjrt {

namespace {

// Whether `t` is its whole storage, dense from its first byte: then the storage's array is the tensor.
bool is_whole_storage(const Tensor& t) {
  return t.offset() == 0 && t.is_contiguous() && t.nbytes() == t.storage()->bytes();
}

// Visits the elements of a view in row-major order, calling f(element offset in the storage).
template <class F>
void for_each_element(const Tensor& t, F&& f) {
  const int64_t n = t.numel();
  if (n == 0) return;
  std::vector<int64_t> index(t.dim(), 0);
  int64_t at = t.offset();
  for (int64_t i = 0; i < n; ++i) {
    f(at);
    for (int64_t d = t.dim() - 1; d >= 0; --d) {
      if (++index[d] < t.size(d)) {
        at += t.stride(d);
        break;
      }
      at -= t.stride(d) * (index[d] - 1);
      index[d] = 0;
    }
  }
}

// The values of a host view, dense in row-major order.
std::vector<char> dense_host_bytes(const Tensor& t) {
  std::vector<char> out(t.nbytes());
  const size_t size = t.element_size();
  const char* base = static_cast<const char*>(t.storage()->data());
  char* to = out.data();
  for_each_element(t, [&](int64_t at) {
    std::memcpy(to, base + at * size, size);
    to += size;
  });
  return out;
}

// Writes dense row-major values into a host view.
void scatter_host_bytes(const char* from, const Tensor& t) {
  const size_t size = t.element_size();
  char* base = static_cast<char*>(t.storage()->data());
  for_each_element(t, [&](int64_t at) {
    std::memcpy(base + at * size, from, size);
    from += size;
  });
}

// `bytes`, the dense values of a tensor of `dtype` and `shape`, as a buffer of those dims on `device`;
// `what` names the copy in an out-of-memory error.
std::shared_ptr<Buffer> upload(const void* bytes, size_t count, DType dtype, const Shape& shape,
                               Device device, const std::string& what) {
  const DeviceHandle handle = device_handle(device);
  return explain_out_of_memory(device, count, what, [&] {
    return handle.client->buffer_from_host(bytes, count, dtype, shape, handle.local_index);
  });
}

}  // namespace

void copy_host_to_device(const Tensor& src, const Tensor& dst) {
  if (dst.numel() == 0) return;
  const std::vector<char> dense = dense_host_bytes(src);
  const std::string what = "a copy of " + src.str() + " from the host";
  if (is_whole_storage(dst) && dst.dtype() == src.dtype() && dst.numel() == src.numel()) {
    // The storage's array as ops writing dst whole would hold it (hlo::device_array_dims).
    device_array(dst).set(upload(dense.data(), dense.size(), src.dtype(), hlo::device_array_dims(dst.shape()),
                                 dst.device(), what));
    return;
  }
  // A view of a larger storage, or another dtype: the device's own copy op writes it.
  const Tensor on_device = Tensor::empty(src.shape(), src.dtype(), dst.device());
  device_array(on_device).set(upload(dense.data(), dense.size(), src.dtype(),
                                     hlo::device_array_dims(src.shape()), dst.device(), what));
  run_op_module(runtime::OpCall{"copy", {on_device}, {dst}, {}});
}

void copy_device_to_host(const Tensor& src, const Tensor& dst) {
  if (dst.numel() == 0) return;
  Tensor dense = src;
  if (!is_whole_storage(src) || src.dtype() != dst.dtype()) {
    dense = Tensor::empty(dst.shape(), dst.dtype(), src.device());
    run_op_module(runtime::OpCall{"copy", {src}, {dense}, {}});
  }
  const std::shared_ptr<Buffer> buffer = device_array(dense).buffer();
  KILN_CHECK(buffer != nullptr,
             "copy: reads " << src.str() << ", which no op has written (made by Tensor::empty)");
  if (dst.is_contiguous()) {
    buffer->to_host(dst.raw_data(), dst.nbytes());
    return;
  }
  std::vector<char> bytes(dst.nbytes());
  buffer->to_host(bytes.data(), bytes.size());
  scatter_host_bytes(bytes.data(), dst);
}

void copy_device_to_host_to_device(const Tensor& src, const Tensor& dst) {
  Tensor staged = Tensor::empty(dst.shape(), dst.dtype(), cpu);
  copy_device_to_host(src, staged);
  copy_host_to_device(staged, dst);
}

}  // namespace kiln::pjrt
