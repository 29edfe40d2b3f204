#include "families/qwen_image/qwen_image_rope.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "kiln/core/error.h"

namespace kiln::models {

namespace {

// QwenEmbedRope precomputes positions -4096..4095 and slices them; a grid or text beyond has no table there.
constexpr int64_t kTablePositions = 4096;

}  // namespace

QwenRopeTables qwen_image_rope(const std::vector<QwenImageShape>& shapes, int64_t text_length,
                               const std::vector<int64_t>& axes_dims, double theta) {
  const char* op = "QwenImageTransformer2DModel";
  KILN_CHECK(axes_dims.size() == 3, op << ": axes_dims_rope must hold 3 values, got " << axes_dims.size());
  KILN_CHECK(!shapes.empty(), op << ": img_shapes is empty; expected at least the noise's grid");
  // Each image's positions along its three axes, then the text's start.
  std::vector<std::array<std::vector<int64_t>, 3>> axis_positions;
  int64_t text_start = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const QwenImageShape& s = shapes[i];
    const auto index = static_cast<int64_t>(i);
    KILN_CHECK(s.frames > 0 && s.height > 0 && s.width > 0 && index + s.frames <= kTablePositions &&
                   s.height <= kTablePositions && s.width <= kTablePositions,
               op << ": img_shapes[" << i << "] is (" << s.frames << ", " << s.height << ", " << s.width
                  << "); expected positive frames, height and width in patches with frames + " << i
                  << " and each side at most " << kTablePositions << " (diffusers' RoPE table)");
    std::array<std::vector<int64_t>, 3> p;
    for (int64_t f = 0; f < s.frames; ++f) p[0].push_back(index + f);
    for (int64_t r = 0; r < s.height; ++r) p[1].push_back(r - (s.height - s.height / 2));
    for (int64_t c = 0; c < s.width; ++c) p[2].push_back(c - (s.width - s.width / 2));
    axis_positions.push_back(std::move(p));
    text_start = std::max({text_start, s.height / 2, s.width / 2});
  }
  KILN_CHECK(text_length >= 0 && text_start + text_length <= kTablePositions,
             op << ": " << text_length << " text tokens after position " << text_start
                << " exceed diffusers' RoPE table of " << kTablePositions << " positions");

  // Per axis, the frequencies 1 / theta^(arange(0, d, 2) / d) in float32 arithmetic, as rope_params.
  int64_t width = 0;
  std::array<std::vector<float>, 3> freqs;
  for (size_t axis = 0; axis < 3; ++axis) {
    const int64_t d = axes_dims[axis];
    KILN_CHECK(d > 0 && d % 2 == 0,
               op << ": every axes_dims_rope value must be positive and even, got " << d);
    for (int64_t k = 0; k < d; k += 2) {
      const float exponent = static_cast<float>(k) / static_cast<float>(d);
      freqs[axis].push_back(1.0f / std::pow(static_cast<float>(theta), exponent));
    }
    width += d;
  }

  int64_t rows = text_length;
  for (const QwenImageShape& s : shapes) rows += s.frames * s.height * s.width;
  std::vector<float> cos_values(static_cast<size_t>(rows * width)), sin_values(cos_values.size());
  int64_t row = 0;
  const auto put = [&](const std::array<int64_t, 3>& position) {
    auto at = static_cast<size_t>(row * width);
    for (size_t axis = 0; axis < 3; ++axis) {
      for (float f : freqs[axis]) {
        // torch.outer(index, freqs) in float32, then torch.polar in float32.
        const float angle = static_cast<float>(position[axis]) * f;
        const auto c = static_cast<float>(std::cos(static_cast<double>(angle)));
        const auto sn = static_cast<float>(std::sin(static_cast<double>(angle)));
        cos_values[at] = cos_values[at + 1] = c;
        sin_values[at] = sin_values[at + 1] = sn;
        at += 2;
      }
    }
    ++row;
  };
  for (int64_t j = 0; j < text_length; ++j) put({text_start + j, text_start + j, text_start + j});
  for (const auto& p : axis_positions)
    for (int64_t f : p[0])
      for (int64_t r : p[1])
        for (int64_t c : p[2]) put({f, r, c});
  return {Tensor::from_vector(cos_values, {rows, width}), Tensor::from_vector(sin_values, {rows, width})};
}

}  // namespace kiln::models
