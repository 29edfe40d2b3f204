#include "backends/pjrt/stablehlo/array_windows.h"

#include <algorithm>
#include <functional>
#include <set>

namespace kiln::pjrt::hlo {

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  return inv;
}

namespace {

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

// The view read through window `w` of `array` held as `dims` (its own, or a split of them), in `dense`.
Value load_window(HloBuilder& b, const Value& array, const Shape& dims, const ViewLayout& v, const Window& w,
                  const Shape& dense) {
  const std::vector<int64_t> carried = carried_view_dims(w);
  const bool in_view_order = std::is_sorted(carried.begin(), carried.end());
  const bool whole = w.start == std::vector<int64_t>(dims.size(), 0) && w.limit == dims && w.steps_are_one();
  // The array's elements in the view's order: one reshape (none when the shapes match).
  if (whole && in_view_order) return b.reshape(array, dense);
  const Value window = b.slice(b.reshape(array, dims), w.start, w.limit, w.step);
  if (in_view_order) return b.reshape(window, dense);
  Shape sizes;
  for (int64_t d : carried) sizes.push_back(v.shape[static_cast<size_t>(d)]);
  return b.reshape(b.transpose(b.reshape(window, sizes), to_view_order(carried)), dense);
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
    update = b.transpose(b.reshape(value, sizes), inverse_permutation(to_view_order(carried)));
  }
  if (thick == dims) return b.reshape(update, array.shape);  // the whole array
  const Value updated = b.dynamic_update_slice(b.reshape(array, dims), b.reshape(update, thick), w.start);
  return b.reshape(updated, array.shape);
}

}  // namespace

std::optional<Value> load_as_window(HloBuilder& b, const Value& array, const ViewLayout& v,
                                    const Shape& dense) {
  if (const Window w = window_of(v, array.shape); w.valid)
    return load_window(b, array, array.shape, v, w, dense);
  Shape split;
  if (!split_along_view(array.shape, v, &split)) return std::nullopt;
  if (const Window w = window_of(v, split); w.valid) return load_window(b, array, split, v, w, dense);
  return std::nullopt;
}

std::optional<Value> store_as_window(HloBuilder& b, const Value& array, const Value& value,
                                     const ViewLayout& v) {
  if (const Window w = window_of(v, array.shape); w.valid && w.steps_are_one())
    return store_window(b, array, array.shape, value, v, w);
  Shape split;
  if (!split_along_view(array.shape, v, &split)) return std::nullopt;
  if (const Window w = window_of(v, split); w.valid && w.steps_are_one())
    return store_window(b, array, split, value, v, w);
  return std::nullopt;
}

}  // namespace kiln::pjrt::hlo
