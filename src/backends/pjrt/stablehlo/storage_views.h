// Tensor views of device storages, in StableHLO. On a PJRT device a Storage is one array of the tensor's
// dtype and storage_bytes / dtype_size elements, row-major: a matrix [rows, columns] whose columns are the
// innermost dim of the tensor that last wrote it whole (device_array_dims), or flat ([n]) when it was never
// written whole. A Tensor is a view of it (shape, strides in elements, offset). load_view reads a view as a
// value of the view's shape; store_view writes a value into a view, giving the storage's new array (PJRT
// buffers are immutable, so a write makes a new array).
//
// Why shaped arrays: a TPU tiles an array's last two dims (8 x 128 f32, 16 x 128 bf16), so a reshape between
// a flat array and a shaped one is a relayout, a copy in scratch; a weight kept flat was copied at every
// product that read it. Held as a matrix of its innermost dim, a weight is read as it is, and an activation
// [B, S, D] is reshaped only above its tiled dims. Why a matrix rather than the writer's own shape: one
// storage is written by tensors of different shapes ([S, D] by a product, [1, S, D] by an add), and modules
// of the same computation must have the same text (a repeated block fed by the embedding or by the block
// before it compiles once).
//
// Paths, tried in order: an empty view is a constant; a view that is a strided window of the array in the
// array's dims, or in a split of them along the view's strides (the whole array, a transpose, heads split off
// a dim, a narrow() or step slice, dims indexed at one position), is reshape (+ slice) (+ transpose);
// otherwise the array is read as flat and a view whose non-broadcast dims tile a strided box of the storage
// is slice + reshape (+ slice) (+ transpose); stride-0 dims become broadcast_in_dim. Anything else
// (overlapping or irregular strides) is a gather (load) or scatter (store) with the element indices computed
// as offset + sum(iota_d * stride_d), so every strided view works.
#pragma once

#include <cstdint>
#include <functional>

#include "backends/pjrt/stablehlo/hlo_builder.h"
#include "kiln/core/tensor.h"

namespace kiln::pjrt::hlo {

struct ViewLayout {
  Shape shape;
  Strides strides;     // in elements; 0 for a broadcast dim
  int64_t offset = 0;  // in elements
};

ViewLayout layout_of(const Tensor& t);
// The storage's element count as a flat array of t's dtype (storage bytes / dtype size).
int64_t storage_elements(const Tensor& t);
// Whether the view's elements are exactly the storage's `storage_elements` elements, in any dim order (a
// dense tensor, or a permutation of one such as attention's sequence-major output): its writes need no old
// storage.
bool covers_whole_storage(const ViewLayout& layout, int64_t storage_elements);

// The dims a device holds a storage in, given the dims of the tensor that writes it whole, in storage order:
// [product of the others, innermost] after dropping dims of one element ([1, S, D] and [S, D] both give
// [S, D]; [B, H, S, D] gives [B * H * S, D]); [n] when at most one dim is left, or when the innermost dim
// is one a TPU pads (neither 2, 4 nor a multiple of 8: a 3x3 convolution's [O, I, 3, 3] weight stays flat).
Shape device_array_dims(const Shape& storage_order_dims);
// The dims of the array a storage holds once written whole through `layout` (covers_whole_storage):
// device_array_dims of its dims in storage order (a permuted view such as attention's sequence-major output
// is held in the order of its strides).
Shape whole_storage_dims(const ViewLayout& layout);

// The dims of the array a tensor's storage is held in (its modules' parameter types). The device's arrays
// answer at run time (backends/pjrt/device_array.h); lowering tests choose.
using ArrayDims = std::function<Shape(const Tensor&)>;
// Every storage flat: [storage_elements(t)].
Shape flat_array_dims(const Tensor& t);
// The storage as `t` would have written it whole: whole_storage_dims(t's layout) when t covers its storage,
// else flat.
Shape array_dims_as_written(const Tensor& t);

// The view `layout` of `array` (any dims; its dtype is the view's). Throws a kiln::Error when the view
// reaches past the storage.
Value load_view(HloBuilder& b, const Value& array, const ViewLayout& layout);
// `array_before` with `value` (the view's shape and the array's dtype) written into the view `layout`;
// returns the new array, of array_before's dims. A view with broadcast (stride-0) dims cannot be written
// (torch refuses too).
Value store_view(HloBuilder& b, const Value& array_before, const Value& value, const ViewLayout& layout);
// The array of a view that covers its whole storage (covers_whole_storage): `value` in storage order, of
// whole_storage_dims(layout).
Value store_whole(HloBuilder& b, const Value& value, const ViewLayout& layout);

}  // namespace kiln::pjrt::hlo
