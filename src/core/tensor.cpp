// Tensor metadata and views. Methods that copy data (contiguous, to, copy_) are in src/ops/copy.cpp.
#include "kiln/core/tensor.h"

#include <algorithm>
#include <cstring>

#include "kiln/core/device_runtime.h"

namespace kiln {

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      dtype_(dtype) {
  KILN_CHECK(shape_.size() == strides_.size(), "Tensor: shape " << shape_str(shape_) << " and strides "
                                                                << shape_str(strides_) << " differ in rank");
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    KILN_CHECK(d >= 0, "Tensor::empty: negative dimension in shape " << shape_str(shape));
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return Tensor(Storage::allocate(bytes, device), shape, contiguous_strides(shape), 0, dtype);
}

// Creation writes the values on the host; a tensor for another device is made there and copied over.
Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  if (device.type != DeviceType::CPU) return zeros(shape, dtype).to(device);
  Tensor t = empty(shape, dtype, device);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  if (device.type != DeviceType::CPU) return full(shape, value, dtype).to(device);
  Tensor t = empty(shape, dtype, device);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = scalar_from_double<T>(value);
    T* p = static_cast<T*>(t.raw_data());
    std::fill(p, p + t.numel(), v);
  });
  return t;
}

Tensor Tensor::from_blob(const void* data, const Shape& shape, DType dtype, Device device) {
  if (device.type != DeviceType::CPU) return from_blob(data, shape, dtype).to(device);
  Tensor t = empty(shape, dtype, device);
  if (t.nbytes()) std::memcpy(t.raw_data(), data, t.nbytes());
  return t;
}

Tensor Tensor::arange(int64_t n, DType dtype) {
  KILN_CHECK(n >= 0, "Tensor::arange: n must be >= 0, got " << n);
  Tensor t = empty({n}, dtype);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.raw_data());
    for (int64_t i = 0; i < n; ++i) p[i] = scalar_from_double<T>(static_cast<double>(i));
  });
  return t;
}

int64_t Tensor::size(int64_t d) const {
  return shape_[normalize_dim(d, dim(), "Tensor::size")];
}
int64_t Tensor::stride(int64_t d) const {
  return strides_[normalize_dim(d, dim(), "Tensor::stride")];
}
Device Tensor::device() const {
  return storage_ ? storage_->device() : cpu;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " on " + device().str();
}

namespace {
Shape infer_shape(const Shape& requested, int64_t numel, const char* op, const Shape& from) {
  Shape shape = requested;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KILN_CHECK(infer < 0, op << ": only one dimension can be -1, got " << shape_str(requested));
      infer = static_cast<int64_t>(i);
    } else {
      KILN_CHECK(shape[i] >= 0, op << ": invalid dimension in " << shape_str(requested));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known != 0 && numel % known == 0,
               op << ": cannot reshape " << shape_str(from) << " into " << shape_str(requested));
    shape[infer] = numel / known;
  }
  KILN_CHECK(shape_numel(shape) == numel, op << ": cannot reshape " << shape_str(from) << " (" << numel
                                             << " elements) into " << shape_str(requested));
  return shape;
}

// Strides for viewing (shape, strides) as new_shape without copying, or empty when impossible
// (the same chunk-matching rule torch uses for view).
bool view_strides(const Shape& shape, const Strides& strides, const Shape& new_shape, Strides& out) {
  out.assign(new_shape.size(), 0);
  // Zero or one element (a 0-d tensor included): strides are irrelevant, any shape of that size is a view.
  if (shape_numel(shape) <= 1) {
    out = contiguous_strides(new_shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}
}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  const Shape s = infer_shape(shape, numel(), "view", shape_);
  Strides st;
  KILN_CHECK(view_strides(shape_, strides_, s, st), "view: cannot view a tensor of shape "
                                                        << shape_str(shape_) << " with strides "
                                                        << shape_str(strides_) << " as " << shape_str(s)
                                                        << "; use reshape (copies)");
  return Tensor(storage_, s, st, offset_, dtype_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  const Shape s = infer_shape(shape, numel(), "reshape", shape_);
  Strides st;
  if (view_strides(shape_, strides_, s, st)) return Tensor(storage_, s, st, offset_, dtype_);
  return contiguous().view(s);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  KILN_CHECK(static_cast<int64_t>(dims.size()) == dim(),
             "permute: got " << dims.size() << " dims for a " << dim() << "-D tensor");
  Shape s(dims.size());
  Strides st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = normalize_dim(dims[i], dim(), "permute");
    KILN_CHECK(!seen[d], "permute: dimension " << dims[i] << " repeated in " << shape_str(dims));
    seen[d] = true;
    s[i] = shape_[d];
    st[i] = strides_[d];
  }
  return Tensor(storage_, s, st, offset_, dtype_);
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  std::vector<int64_t> dims(shape_.size());
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(i);
  std::swap(dims[normalize_dim(a, dim(), "transpose")], dims[normalize_dim(b, dim(), "transpose")]);
  return permute(dims);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = normalize_dim(d, dim(), "slice");
  KILN_CHECK(step > 0, "slice: step must be positive, got " << step);
  const int64_t n = shape_[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = shape_;
  Strides st = strides_;
  s[d] = (end - start + step - 1) / step;
  st[d] = strides_[d] * step;
  return Tensor(storage_, s, st, offset_ + start * strides_[d], dtype_);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = normalize_dim(d, dim(), "narrow");
  KILN_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d],
             "narrow: range [" << start << ", " << start + length << ") out of bounds for dimension " << d
                               << " of size " << shape_[d]);
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = normalize_dim(d, dim(), "select");
  const int64_t n = shape_[d];
  KILN_CHECK(index >= -n && index < n,
             "select: index " << index << " out of range for dimension " << d << " of size " << n);
  if (index < 0) index += n;
  Shape s = shape_;
  Strides st = strides_;
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return Tensor(storage_, s, st, offset_ + index * strides_[d], dtype_);
}

Tensor Tensor::expand(const Shape& shape) const {
  KILN_CHECK(shape.size() >= shape_.size(),
             "expand: cannot expand " << shape_str(shape_) << " to fewer dims " << shape_str(shape));
  const size_t lead = shape.size() - shape_.size();
  Shape s(shape.size());
  Strides st(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      KILN_CHECK(shape[i] >= 0, "expand: invalid size " << shape[i] << " in " << shape_str(shape));
      s[i] = shape[i];
      continue;
    }
    const int64_t cur = shape_[i - lead];
    const int64_t want = shape[i] == -1 ? cur : shape[i];
    KILN_CHECK(cur == want || cur == 1, "expand: cannot expand " << shape_str(shape_) << " to "
                                                                 << shape_str(shape) << " (dimension " << i
                                                                 << " is " << cur << ")");
    s[i] = want;
    st[i] = cur == want ? strides_[i - lead] : 0;
  }
  return Tensor(storage_, s, st, offset_, dtype_);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = normalize_dim(d, dim() + 1, "unsqueeze");
  Shape s = shape_;
  Strides st = strides_;
  const int64_t inner = d < dim() ? strides_[d] * shape_[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, inner);
  return Tensor(storage_, s, st, offset_, dtype_);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = normalize_dim(d, dim(), "squeeze");
  if (shape_[d] != 1) return *this;
  Shape s = shape_;
  Strides st = strides_;
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return Tensor(storage_, s, st, offset_, dtype_);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = normalize_dim(start_dim, dim(), "flatten");
  end_dim = normalize_dim(end_dim, dim(), "flatten");
  KILN_CHECK(start_dim <= end_dim, "flatten: start_dim " << start_dim << " is after end_dim " << end_dim);
  Shape s(shape_.begin(), shape_.begin() + start_dim);
  int64_t n = 1;
  for (int64_t i = start_dim; i <= end_dim; ++i) n *= shape_[i];
  s.push_back(n);
  s.insert(s.end(), shape_.begin() + end_dim + 1, shape_.end());
  return reshape(s);
}

void* Tensor::host_data() const {
  KILN_CHECK(defined(), "Tensor::data: tensor is undefined");
  KILN_CHECK(device().type == DeviceType::CPU,
             "Tensor::data: tensor is on " << device().str() << "; copy it with .to(kiln::cpu)");
  if (HostReadObserver* observer = host_read_observer()) observer->before_host_read(*this);
  storage_->wait_for_writes();
  return raw_data();
}

double Tensor::item() const {
  KILN_CHECK(numel() == 1, "Tensor::item: tensor of shape " << shape_str(shape_) << " has " << numel()
                                                            << " elements, expected 1");
  if (device().type != DeviceType::CPU) return to(cpu).item();
  if (HostReadObserver* observer = host_read_observer()) observer->before_host_read(*this);
  storage_->wait_for_writes();
  return visit_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    T v;
    std::memcpy(&v, raw_data(), sizeof(T));
    return scalar_to_double(v);
  });
}

}  // namespace kiln
