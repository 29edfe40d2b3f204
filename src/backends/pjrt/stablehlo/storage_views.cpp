#include "backends/pjrt/stablehlo/storage_views.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {
namespace {

// The dims that address distinct elements (size > 1, stride != 0), sorted by stride, largest first, and the
// strided box of the storage they tile: box dim 0 has the outer dim's size, box dim i > 0 has
// stride[i - 1] / stride[i] elements, and a last box dim of the inner stride holds the element itself at 0.
// The view is then box[:size0, :size1, ..., :size_k-1, 0].
struct Box {
  std::vector<int64_t> dims;     // view dims, outer (largest stride) first
  std::vector<int64_t> sizes;    // their sizes
  std::vector<int64_t> extents;  // the box's dims (one more than `dims`)
  int64_t span = 1;              // elements the box covers from the view's offset
  bool valid = false;            // the dims tile a box (no overlap, each stride divides the next outer one)
  bool contiguous = false;       // the box is exactly the view's elements (a permutation of a dense block)
};

Box box_of(const ViewLayout& v) {
  Box box;
  for (size_t d = 0; d < v.shape.size(); ++d)
    if (v.shape[d] > 1 && v.strides[d] != 0) box.dims.push_back(static_cast<int64_t>(d));
  std::stable_sort(box.dims.begin(), box.dims.end(), [&](int64_t a, int64_t b) {
    return v.strides[static_cast<size_t>(a)] > v.strides[static_cast<size_t>(b)];
  });
  const size_t k = box.dims.size();
  for (int64_t d : box.dims) box.sizes.push_back(v.shape[static_cast<size_t>(d)]);
  if (k == 0) {
    box.extents = {1};
    box.valid = box.contiguous = true;
    return box;
  }
  auto stride = [&](size_t i) { return v.strides[static_cast<size_t>(box.dims[i])]; };
  box.valid = stride(k - 1) > 0;
  box.extents.push_back(box.sizes[0]);
  for (size_t i = 1; i < k && box.valid; ++i) {
    box.valid = stride(i) > 0 && stride(i - 1) % stride(i) == 0 && box.sizes[i] * stride(i) <= stride(i - 1);
    if (box.valid) box.extents.push_back(stride(i - 1) / stride(i));
  }
  if (!box.valid) return box;
  box.extents.push_back(stride(k - 1));
  box.span = box.sizes[0] * stride(0);
  box.contiguous = stride(k - 1) == 1;
  for (size_t i = 1; i < k; ++i) box.contiguous = box.contiguous && box.extents[i] == box.sizes[i];
  return box;
}

// The view's shape with its broadcast dims as 1.
Shape unbroadcast_shape(const ViewLayout& v) {
  Shape s = v.shape;
  for (size_t d = 0; d < s.size(); ++d)
    if (v.strides[d] == 0) s[d] = 1;
  return s;
}

// perm taking the box's dim order (outer first) to the view's dim order.
std::vector<int64_t> box_to_view_perm(const Box& box) {
  std::vector<int64_t> view_order = box.dims;
  std::sort(view_order.begin(), view_order.end());
  std::vector<int64_t> perm;
  for (int64_t d : view_order)
    perm.push_back(std::find(box.dims.begin(), box.dims.end(), d) - box.dims.begin());
  return perm;
}

std::vector<int64_t> inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  return inv;
}

void check_in_bounds(const ViewLayout& v, int64_t n, const char* what) {
  int64_t last = v.offset;
  for (size_t d = 0; d < v.shape.size(); ++d) {
    KILN_CHECK(v.strides[d] >= 0, what << ": negative stride in view " << shape_str(v.shape) << " strides "
                                       << shape_str(v.strides));
    last += (v.shape[d] - 1) * v.strides[d];
  }
  KILN_CHECK(v.offset >= 0 && last < n, what << ": view " << shape_str(v.shape) << " strides "
                                             << shape_str(v.strides) << " offset " << v.offset
                                             << " reaches element " << last << " of a storage of " << n);
}

// The box's elements, flat, from the flat array (zero-padded where the box runs past its end: the padding is
// never part of the view).
Value load_box(HloBuilder& b, const Value& flat, const ViewLayout& v, const Box& box) {
  const int64_t n = flat.shape[0];
  const int64_t end = std::min(n, v.offset + box.span);
  const Value region = b.slice(flat, {v.offset}, {end});
  if (end - v.offset == box.span) return region;
  return b.pad(region, b.scalar(0, flat.dtype), {0}, {box.span - (end - v.offset)});
}

// offset + sum_d iota_d * stride_d over the view's shape: the flat index of every element.
Value element_indices(HloBuilder& b, const ViewLayout& v) {
  Value idx = b.splat(static_cast<double>(v.offset), DType::Int64, v.shape);
  for (size_t d = 0; d < v.shape.size(); ++d) {
    if (v.shape[d] <= 1 || v.strides[d] == 0) continue;
    const Value along = b.iota(DType::Int64, v.shape, static_cast<int64_t>(d));
    idx = b.add(idx, b.mul(along, b.splat(static_cast<double>(v.strides[d]), DType::Int64, v.shape)));
  }
  return idx;
}

// `value` (the view's shape) with its dims in the box's order, outer first, size-1 dims dropped.
Value box_ordered(HloBuilder& b, const Value& value, const ViewLayout& v, const Box& box) {
  std::vector<int64_t> view_order = box.dims;
  std::sort(view_order.begin(), view_order.end());
  Shape s;
  for (int64_t d : view_order) s.push_back(v.shape[static_cast<size_t>(d)]);
  return b.transpose(b.reshape(value, s), inverse(box_to_view_perm(box)));
}

// Row-major strides of an array of `dims`, in elements.
std::vector<int64_t> row_major_strides(const Shape& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t j = dims.size(); j-- > 1;) strides[j - 1] = strides[j] * dims[j];
  return strides;
}

// A view as a strided window of an array in the array's own dims: array dim j is read at start[j],
// start[j] + step[j], ... below limit[j], and carries view dim view_dim[j] (-1: the window is one element
// thick there). The view's dims of one element and its broadcast dims carry no array dim.
struct Window {
  bool valid = false;
  std::vector<int64_t> start, limit, step, view_dim;
  bool steps_are_one() const {
    for (int64_t s : step)
      if (s != 1) return false;
    return true;
  }
};

Window window_of(const ViewLayout& v, const Shape& dims) {
  Window w;
  const size_t rank = dims.size();
  const std::vector<int64_t> strides = row_major_strides(dims);
  w.start.assign(rank, 0);
  w.step.assign(rank, 1);
  w.view_dim.assign(rank, -1);
  int64_t rest = v.offset;
  for (size_t j = 0; j < rank; ++j) {
    w.start[j] = rest / strides[j];
    rest %= strides[j];
  }
  for (size_t d = 0; d < v.shape.size(); ++d) {
    if (v.shape[d] <= 1 || v.strides[d] == 0) continue;
    // The outermost array dim whose stride divides the view's: a step along it.
    size_t j = 0;
    while (j < rank && (dims[j] <= 1 || v.strides[d] % strides[j] != 0)) ++j;
    if (j == rank || w.view_dim[j] >= 0) return w;
    const int64_t step = v.strides[d] / strides[j];
    if (w.start[j] + (v.shape[d] - 1) * step >= dims[j]) return w;
    w.view_dim[j] = static_cast<int64_t>(d);
    w.step[j] = step;
  }
  w.limit.resize(rank);
  for (size_t j = 0; j < rank; ++j) {
    const int64_t size = w.view_dim[j] < 0 ? 1 : v.shape[static_cast<size_t>(w.view_dim[j])];
    w.limit[j] = w.start[j] + (size - 1) * w.step[j] + 1;
  }
  w.valid = true;
  return w;
}

// `dims` split further so that each of the view's strides is the stride of a dim (heads split off a [S, H *
// D] array: [S, H, D]), when the array's and the view's strides nest (each divides the next larger one);
// false otherwise, or when nothing would be split.
bool split_along_view(const Shape& dims, const ViewLayout& v, Shape* split) {
  const int64_t n = shape_numel(dims);
  std::vector<int64_t> bounds = row_major_strides(dims);
  bounds.push_back(n);
  const size_t before = std::set<int64_t>(bounds.begin(), bounds.end()).size();
  for (size_t d = 0; d < v.shape.size(); ++d)
    if (v.shape[d] > 1 && v.strides[d] != 0 && v.strides[d] < n) bounds.push_back(v.strides[d]);
  std::sort(bounds.begin(), bounds.end(), std::greater<int64_t>());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  if (bounds.size() == before) return false;
  split->clear();
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    if (bounds[i] % bounds[i + 1] != 0) return false;
    split->push_back(bounds[i] / bounds[i + 1]);
  }
  return true;
}

// The view dims the window carries, in array order, and their sizes.
std::vector<int64_t> carried_view_dims(const Window& w) {
  std::vector<int64_t> out;
  for (int64_t d : w.view_dim)
    if (d >= 0) out.push_back(d);
  return out;
}

// perm taking `order` (distinct view dims) to ascending view order.
std::vector<int64_t> to_view_order(const std::vector<int64_t>& order) {
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> perm;
  for (int64_t d : sorted) perm.push_back(std::find(order.begin(), order.end(), d) - order.begin());
  return perm;
}

// The view read through window `w` of `array` held as `dims` (its own, or a split of them).
Value load_window(HloBuilder& b, const Value& array, const Shape& dims, const ViewLayout& v,
                  const Window& w) {
  const std::vector<int64_t> carried = carried_view_dims(w);
  const bool in_view_order = std::is_sorted(carried.begin(), carried.end());
  const bool whole = w.start == std::vector<int64_t>(dims.size(), 0) && w.limit == dims && w.steps_are_one();
  // The array's elements in the view's order: one reshape (none when the shapes match).
  if (whole && in_view_order) return b.reshape(array, unbroadcast_shape(v));
  const Value window = b.slice(b.reshape(array, dims), w.start, w.limit, w.step);
  if (in_view_order) return b.reshape(window, unbroadcast_shape(v));
  Shape sizes;
  for (int64_t d : carried) sizes.push_back(v.shape[static_cast<size_t>(d)]);
  return b.reshape(b.transpose(b.reshape(window, sizes), to_view_order(carried)), unbroadcast_shape(v));
}

// `array` (held as `dims`: its own, or a split of them) with `value` (the view's shape, no broadcast dims)
// written into the window (steps of one); the new array, of array's dims.
Value store_window(HloBuilder& b, const Value& array, const Shape& dims, const Value& value,
                   const ViewLayout& v, const Window& w) {
  const std::vector<int64_t> carried = carried_view_dims(w);
  Shape thick;
  for (size_t j = 0; j < w.start.size(); ++j) thick.push_back(w.limit[j] - w.start[j]);
  Value update;
  if (std::is_sorted(carried.begin(), carried.end())) {
    update = value;
  } else {
    std::vector<int64_t> view_order = carried;
    std::sort(view_order.begin(), view_order.end());
    Shape sizes;
    for (int64_t d : view_order) sizes.push_back(v.shape[static_cast<size_t>(d)]);
    update = b.transpose(b.reshape(value, sizes), inverse(to_view_order(carried)));
  }
  if (thick == dims) return b.reshape(update, array.shape);  // the whole array
  const Value updated = b.dynamic_update_slice(b.reshape(array, dims), b.reshape(update, thick), w.start);
  return b.reshape(updated, array.shape);
}

}  // namespace

ViewLayout layout_of(const Tensor& t) {
  return ViewLayout{t.shape(), t.strides(), t.offset()};
}

int64_t storage_elements(const Tensor& t) {
  return static_cast<int64_t>(t.storage()->bytes() / t.element_size());
}

bool covers_whole_storage(const ViewLayout& layout, int64_t storage_elements) {
  for (size_t d = 0; d < layout.shape.size(); ++d)
    if (layout.strides[d] == 0 && layout.shape[d] > 1) return false;
  return layout.offset == 0 && shape_numel(layout.shape) == storage_elements &&
         (storage_elements <= 1 || box_of(layout).contiguous);
}

Shape device_array_dims(const Shape& storage_order_dims) {
  Shape kept;
  for (int64_t d : storage_order_dims)
    if (d != 1) kept.push_back(d);
  const int64_t n = shape_numel(storage_order_dims);
  if (kept.size() <= 1 || n == 0) return {n};
  const int64_t columns = kept.back();
  // A TPU pads other innermost dims (3 to 4, 6 to 8, 12 to 16: a 3x3 convolution's weight would take a
  // third more memory as a matrix); flat, it takes what it needs.
  if (columns != 2 && columns != 4 && columns % 8 != 0) return {n};
  return {n / columns, columns};
}

Shape whole_storage_dims(const ViewLayout& layout) {
  return device_array_dims(box_of(layout).sizes);
}

Shape flat_array_dims(const Tensor& t) {
  return {storage_elements(t)};
}

Shape array_dims_as_written(const Tensor& t) {
  const ViewLayout layout = layout_of(t);
  const int64_t n = storage_elements(t);
  return covers_whole_storage(layout, n) ? whole_storage_dims(layout) : Shape{n};
}

namespace {

// The view of a flat array.
Value load_flat_view(HloBuilder& b, const Value& flat, const ViewLayout& v) {
  const Box box = box_of(v);
  Value dense;  // the view's values with its broadcast dims as 1
  if (box.valid) {
    Value boxed = load_box(b, flat, v, box);
    if (!box.contiguous) {
      std::vector<int64_t> limit = box.sizes;
      limit.push_back(1);
      boxed = b.slice(b.reshape(boxed, box.extents), std::vector<int64_t>(limit.size(), 0), limit);
    }
    const std::vector<int64_t> perm = box_to_view_perm(box);
    // In the view's order already: one reshape to its shape (not one to the box's, then another).
    if (!std::is_sorted(box.dims.begin(), box.dims.end()))
      boxed = b.transpose(b.reshape(boxed, box.sizes), perm);
    dense = b.reshape(boxed, unbroadcast_shape(v));
  } else {
    const ViewLayout distinct{unbroadcast_shape(v), v.strides, v.offset};
    const GatherDims dims{{}, {0}, {0}, static_cast<int64_t>(v.shape.size())};
    dense = b.gather(flat, element_indices(b, distinct), dims, {1});
  }
  return dense;
}

// `flat_before` with `value` written into the view; the new flat array.
Value store_flat_view(HloBuilder& b, const Value& flat_before, const Value& value, const ViewLayout& v) {
  const int64_t n = flat_before.shape[0];
  const Box box = box_of(v);
  if (!box.valid) {
    const int64_t rank = static_cast<int64_t>(v.shape.size());
    const ScatterDims dims{{}, {0}, {0}, rank};
    return b.scatter_replace(flat_before, element_indices(b, v), value, dims);
  }
  const Value ordered = box_ordered(b, value, v, box);
  Value region;  // the new elements [offset, offset + len)
  int64_t len = 0;
  if (box.contiguous) {
    len = shape_numel(v.shape);
    region = b.reshape(ordered, {len});
  } else {
    // Read the box, write the value into its corner, keep what the storage holds (the padding is dropped).
    Shape corner = box.sizes;
    corner.push_back(1);
    const Value boxed =
        b.dynamic_update_slice(b.reshape(load_box(b, flat_before, v, box), box.extents),
                               b.reshape(ordered, corner), std::vector<int64_t>(corner.size(), 0));
    len = std::min(n, v.offset + box.span) - v.offset;
    region = b.slice(b.reshape(boxed, {box.span}), {0}, {len});
  }
  if (v.offset == 0 && len == n) return region;
  return b.dynamic_update_slice(flat_before, region, {v.offset});
}

}  // namespace

Value load_view(HloBuilder& b, const Value& array, const ViewLayout& v) {
  KILN_CHECK(v.shape.size() == v.strides.size(),
             "load_view: shape " << shape_str(v.shape) << " with strides " << shape_str(v.strides));
  if (shape_numel(v.shape) == 0) return b.splat(0, array.dtype, v.shape);
  check_in_bounds(v, array.numel(), "load_view");
  Value dense;
  Shape split;
  if (const Window window = window_of(v, array.shape); window.valid) {
    dense = load_window(b, array, array.shape, v, window);
  } else if (const Window in_split =
                 split_along_view(array.shape, v, &split) ? window_of(v, split) : Window{};
             in_split.valid) {
    dense = load_window(b, array, split, v, in_split);
  } else {
    dense = load_flat_view(b, b.reshape(array, {array.numel()}), v);
  }
  return b.broadcast_to(dense, v.shape);
}

Value store_view(HloBuilder& b, const Value& array_before, const Value& value, const ViewLayout& v) {
  KILN_CHECK(value.shape == v.shape && value.dtype == array_before.dtype,
             "store_view: value " << dtype_name(value.dtype) << shape_str(value.shape)
                                  << " does not fit view " << shape_str(v.shape) << " of a "
                                  << dtype_name(array_before.dtype) << " storage");
  if (shape_numel(v.shape) == 0) return array_before;
  for (size_t d = 0; d < v.shape.size(); ++d)
    KILN_CHECK(v.strides[d] != 0 || v.shape[d] == 1, "store_view: cannot write into view "
                                                         << shape_str(v.shape) << " strides "
                                                         << shape_str(v.strides) << ": dim " << d
                                                         << " is broadcast (stride 0)");
  check_in_bounds(v, array_before.numel(), "store_view");
  if (const Window window = window_of(v, array_before.shape); window.valid && window.steps_are_one())
    return store_window(b, array_before, array_before.shape, value, v, window);
  Shape split;
  if (split_along_view(array_before.shape, v, &split)) {
    if (const Window window = window_of(v, split); window.valid && window.steps_are_one())
      return store_window(b, array_before, split, value, v, window);
  }
  const Value flat = b.reshape(array_before, {array_before.numel()});
  return b.reshape(store_flat_view(b, flat, value, v), array_before.shape);
}

Value store_whole(HloBuilder& b, const Value& value, const ViewLayout& v) {
  const int64_t n = shape_numel(v.shape);
  KILN_CHECK(covers_whole_storage(v, n), "store_whole: view " << shape_str(v.shape) << " strides "
                                                              << shape_str(v.strides) << " offset "
                                                              << v.offset << " is not a whole dense storage");
  const Box box = box_of(v);
  // A dense tensor is reshaped into its array; a permuted one is transposed into storage order first.
  const Value ordered =
      std::is_sorted(box.dims.begin(), box.dims.end()) ? value : box_ordered(b, value, v, box);
  return b.reshape(ordered, whole_storage_dims(v));
}

}  // namespace kiln::pjrt::hlo
