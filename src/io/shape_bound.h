// The bounds the weight readers (GGUF, safetensors) put on a tensor shape read from a file, before any size
// is computed from it: the element count, and the extent (the product of the dimensions with zeros counted as
// one, a tensor's largest stride), so that an empty tensor cannot carry a stride whose size in bytes
// overflows.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::io {

class ShapeBound {
 public:
  // No real tensor has 2^62 elements; the bound keeps every later size computation free of overflow.
  static constexpr uint64_t kMaxElements = 1ull << 62;
  // Strides in bytes (up to 8 per element) fit in int64 even when a zero dimension makes the tensor empty.
  static constexpr uint64_t kMaxExtent = 1ull << 59;

  // Takes the next dimension; false when the shape leaves the bounds (the bound is then spent).
  bool add(uint64_t dim) {
    return dim <= kMaxElements && !__builtin_mul_overflow(numel_, dim, &numel_) && numel_ <= kMaxElements &&
           !__builtin_mul_overflow(extent_, std::max<uint64_t>(dim, 1), &extent_) && extent_ <= kMaxExtent;
  }
  uint64_t numel() const { return numel_; }

 private:
  uint64_t numel_ = 1;
  uint64_t extent_ = 1;
};

}  // namespace kiln::io
