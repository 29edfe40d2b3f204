// Views read and written as windows of a storage's shaped array (storage_views.h), in the array's own dims or
// in a split of them along the view's strides: a slice (+ reshape) (+ transpose) of the array, or one
// dynamic_update_slice into it, and never the flat array, whose reshapes a TPU pays for as relayouts.
//
// A view is a window of an array of dims A when its offset decomposes into a start index per dim of A and
// each of its dims (of more than one element, not broadcast) steps along a distinct dim of A within bounds:
// the whole array, a transpose, a narrow() or step slice, dims indexed at one position. A split of A refines
// its dims at each of the view's strides where the strides nest ([S, H * D] read as heads: [S, H, D]).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "backends/pjrt/stablehlo/hlo_builder.h"
#include "backends/pjrt/stablehlo/storage_views.h"

namespace kiln::pjrt::hlo {

// The view `v` of `array` as a window, its values of shape `dense` (the view's, broadcast dims as 1); nullopt
// when no window of the array's dims or of a split of them is the view. The view is inside the array.
std::optional<Value> load_as_window(HloBuilder& b, const Value& array, const ViewLayout& v,
                                    const Shape& dense);
// `array` with `value` (the view's shape; no broadcast dims) written into the view `v` as a window with steps
// of one, the new array of array's dims; nullopt when the view is no such window.
std::optional<Value> store_as_window(HloBuilder& b, const Value& array, const Value& value,
                                     const ViewLayout& v);

// The permutation undoing `perm`.
std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm);

}  // namespace kiln::pjrt::hlo
