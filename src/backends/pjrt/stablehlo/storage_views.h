// Tensor views of flat device storages, in StableHLO. On a PJRT device a Storage is one flat array (the
// tensor's dtype, storage_bytes / dtype_size elements); a Tensor is a view of it (shape, strides in elements,
// offset). load_view reads a view as a value of the view's shape; store_view writes a value into a view,
// giving the storage's new flat array (PJRT buffers are immutable, so a write makes a new array).
//
// Fast paths, tried in order: an empty view is a constant; a view whose non-broadcast dims tile a strided box
// of the storage (contiguous, a permutation of a contiguous block such as a transpose, a narrow() of any dim,
// a step slice) is slice + reshape (+ slice) (+ transpose); stride-0 dims become broadcast_in_dim. Anything
// else (overlapping or irregular strides) is a gather (load) or scatter (store) with the element indices
// computed as offset + sum(iota_d * stride_d), so every strided view works.
#pragma once

#include <cstdint>

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

// The view `layout` of `flat` (rank 1; its dtype is the view's). Throws a kiln::Error when the view reaches
// past the storage.
Value load_view(HloBuilder& b, const Value& flat, const ViewLayout& layout);
// `flat_before` with `value` (the view's shape and flat's dtype) written into the view `layout`; returns the
// new flat array. A view with broadcast (stride-0) dims cannot be written (torch refuses too).
Value store_view(HloBuilder& b, const Value& flat_before, const Value& value, const ViewLayout& layout);
// The flat array of a view that covers its whole storage (covers_whole_storage): `value` in storage order.
Value store_whole(HloBuilder& b, const Value& value, const ViewLayout& layout);

}  // namespace kiln::pjrt::hlo
