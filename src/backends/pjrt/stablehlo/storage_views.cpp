#include "backends/pjrt/stablehlo/storage_views.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "backends/pjrt/stablehlo/array_windows.h"
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
  return b.transpose(b.reshape(value, s), inverse_permutation(box_to_view_perm(box)));
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
  std::optional<Value> dense = load_as_window(b, array, v, unbroadcast_shape(v));
  if (!dense) dense = load_flat_view(b, b.reshape(array, {array.numel()}), v);
  return b.broadcast_to(*dense, v.shape);
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
  if (std::optional<Value> stored = store_as_window(b, array_before, value, v)) return *stored;
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
