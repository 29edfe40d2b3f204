// Shapes and strides (in elements) are small vectors of int64.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace kiln {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
Strides contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3, 4]"
// Wraps a possibly negative dimension index; `op` names the caller in the error.
int64_t normalize_dim(int64_t dim, int64_t rank, const char* op);
// The broadcast of two shapes (numpy rules); throws naming `op` and both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace kiln
