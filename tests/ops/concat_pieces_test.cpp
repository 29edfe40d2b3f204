// concat copies rows longer than its piece size (64 KiB) in pieces across threads: the result must be the
// same bytes whatever the split, for one long row per input (batch 1, FLUX's text + image tokens) and for
// several rows.
#include <gtest/gtest.h>

#include <vector>

#include "kiln/ops/layout.h"

namespace kiln {
namespace {

Tensor iota(const Shape& shape, DType dtype, float start) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<float>(i % 251);
  return Tensor::from_vector(v, shape).to(dtype);
}

void check_concat(const std::vector<Tensor>& parts, int64_t dim) {
  const Tensor out = concat(parts, dim);
  const auto got = out.to(float32).to_vector<float>();
  // Expected by walking the output index space: outer (dims before `dim`), then each part's slab.
  int64_t outer = 1;
  for (int64_t k = 0; k < dim; ++k) outer *= out.size(k);
  size_t at = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor& p : parts) {
      const auto src = p.to(float32).to_vector<float>();
      const int64_t slab = p.numel() / outer;
      for (int64_t i = 0; i < slab; ++i, ++at) {
        ASSERT_EQ(got[at], src[static_cast<size_t>(o * slab + i)]) << "element " << at;
      }
    }
  }
  EXPECT_EQ(at, got.size());
}

TEST(ConcatPieces, OneLongRowPerInputIsCopiedExactly) {
  // [1, S, H, D] bf16 along dim 1: 512 text + 1031 image tokens of 3 x 40 (rows of 122880 and 247440 bytes,
  // neither a multiple of the piece size).
  check_concat({iota({1, 512, 3, 40}, bfloat16, 0.0f), iota({1, 1031, 3, 40}, bfloat16, 1000.0f)}, 1);
  // float32, three inputs, one of them empty along dim.
  check_concat({iota({1, 3, 70001}, float32, 0.0f), iota({1, 0, 70001}, float32, 0.0f),
                iota({1, 2, 70001}, float32, -500.0f)},
               1);
}

TEST(ConcatPieces, ManyRowsWithLongSlabs) {
  check_concat({iota({3, 40000}, float32, 0.0f), iota({3, 17}, float32, 7.0f)}, 1);
  check_concat({iota({2, 5, 9000}, bfloat16, 0.0f), iota({2, 5, 7}, bfloat16, 3.0f)}, 2);
}

}  // namespace
}  // namespace kiln
