#include "kiln/models/qwen2_5_vl_vision.h"

#include <algorithm>
#include <cmath>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/nn/renamed_weights.h"
#include "kiln/ops.h"
#include "kiln/ops/attention.h"
#include "qwen2_5_vl_vision_layout.h"

namespace kiln::models {
namespace {

// transformers' Qwen2_5_VLRMSNorm: the Llama style, its epsilon fixed at 1e-6 whatever the config says.
constexpr double kNormEps = 1e-6;

// The 2-D rotary tables [S, head_dim] float32 for patches at (row, col), rows in `order`: a quarter of the
// head's frequencies turn with the row, the next quarter with the column, the second half repeats the first
// (rotate-half), computed in float32 as transformers' Qwen2_5_VLVisionRotaryEmbedding.
std::pair<Tensor, Tensor> vision_rope(const VisionLayout& layout, const std::vector<int64_t>& order,
                                      int64_t head_dim, double theta) {
  const int64_t quarter = head_dim / 4, spatial = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(quarter));
  for (int64_t i = 0; i < quarter; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(spatial);
    inv_freq[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  const int64_t S = static_cast<int64_t>(order.size());
  std::vector<float> cos(static_cast<size_t>(S * head_dim)), sin(cos.size());
  for (int64_t s = 0; s < S; ++s) {
    const size_t p = static_cast<size_t>(order[static_cast<size_t>(s)]);
    for (int64_t axis = 0; axis < 2; ++axis) {
      const float position = static_cast<float>(axis == 0 ? layout.row[p] : layout.col[p]);
      for (int64_t i = 0; i < quarter; ++i) {
        const float angle = position * inv_freq[static_cast<size_t>(i)];
        for (int64_t half = 0; half < 2; ++half) {
          const size_t at = static_cast<size_t>(s * head_dim + half * spatial + axis * quarter + i);
          cos[at] = std::cos(angle);
          sin[at] = std::sin(angle);
        }
      }
    }
  }
  return {Tensor::from_vector(cos, {S, head_dim}), Tensor::from_vector(sin, {S, head_dim})};
}

Tensor index_tensor(const std::vector<int64_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

}  // namespace

Qwen2_5_VLVisionModel::Block::Block(const Qwen2_5_VLVisionConfig& c)
    : heads(c.num_heads),
      head_dim(c.head_dim()),
      norm1(c.hidden_size, kNormEps, true, RmsNormStyle::Llama),
      norm2(c.hidden_size, kNormEps, true, RmsNormStyle::Llama),
      qkv(c.hidden_size, 3 * c.hidden_size, true),
      proj(c.hidden_size, c.hidden_size, true),
      gate_proj(c.hidden_size, c.intermediate_size, true),
      up_proj(c.hidden_size, c.intermediate_size, true),
      down_proj(c.intermediate_size, c.hidden_size, true) {
  register_module("norm1", &norm1);
  register_module("norm2", &norm2);
  register_module("attn.qkv", &qkv);
  register_module("attn.proj", &proj);
  register_module("mlp.gate_proj", &gate_proj);
  register_module("mlp.up_proj", &up_proj);
  register_module("mlp.down_proj", &down_proj);
}

Tensor Qwen2_5_VLVisionModel::Block::forward(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                             const std::vector<int64_t>& segments) const {
  const int64_t S = x.size(0), H = heads, D = head_dim;
  // [S, 3, H, D] -> q, k, v [1, H, S, D]; the rotation in float32 (apply_rope's), back in x's dtype.
  const Tensor projected = qkv(norm1(x)).view({S, 3, H, D}).permute({1, 2, 0, 3});
  const Tensor q = apply_rope(projected.narrow(0, 0, 1), cos, sin, RopeStyle::RotateHalf);
  const Tensor k = apply_rope(projected.narrow(0, 1, 1), cos, sin, RopeStyle::RotateHalf);
  const Tensor v = projected.narrow(0, 2, 1);
  // Attention within each group (a window, or a whole image frame), as transformers splits the sequence.
  std::vector<Tensor> parts;
  parts.reserve(segments.size());
  int64_t start = 0;
  for (int64_t length : segments) {
    parts.push_back(scaled_dot_product_attention(q.narrow(2, start, length), k.narrow(2, start, length),
                                                 v.narrow(2, start, length)));
    start += length;
  }
  const Tensor attn = parts.size() == 1 ? parts[0] : concat(parts, 2);
  const Tensor out = add(x, proj(attn.permute({0, 2, 1, 3}).reshape({S, H * D})));
  const Tensor f = norm2(out);
  return add(out, down_proj(mul(silu(gate_proj(f)), up_proj(f))));
}

Qwen2_5_VLVisionModel::Qwen2_5_VLVisionModel(const Qwen2_5_VLVisionConfig& config)
    : config_(config),
      ln_q_(config.hidden_size, kNormEps, true, RmsNormStyle::Llama),
      merger_fc1_(config.hidden_size * config.spatial_merge_size * config.spatial_merge_size,
                  config.hidden_size * config.spatial_merge_size * config.spatial_merge_size, true),
      merger_fc2_(config.hidden_size * config.spatial_merge_size * config.spatial_merge_size,
                  config.out_hidden_size, true) {
  register_parameter("patch_embed.proj.weight", &patch_weight_,
                     {config.hidden_size, config.in_channels, config.temporal_patch_size, config.patch_size,
                      config.patch_size});
  for (int64_t i = 0; i < config.depth; ++i) {
    blocks_.push_back(std::make_unique<Block>(config));
    register_module("blocks." + std::to_string(i), blocks_.back().get());
  }
  register_module("merger.ln_q", &ln_q_);
  register_module("merger.mlp.0", &merger_fc1_);
  register_module("merger.mlp.2", &merger_fc2_);
}

Tensor Qwen2_5_VLVisionModel::forward(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) const {
  const auto& c = config_;
  const int64_t merge = c.spatial_merge_size, unit = merge * merge;
  KILN_CHECK(!grids.empty(), "Qwen2_5_VLVisionModel: no image grid given");
  int64_t patches = 0;
  for (const ImageGrid& g : grids) {
    KILN_CHECK(g.t > 0 && g.h > 0 && g.w > 0 && g.h % merge == 0 && g.w % merge == 0 &&
                   g.h <= limits::kMaxImageSide && g.w <= limits::kMaxImageSide && g.t <= 1024,
               "Qwen2_5_VLVisionModel: image grid ("
                   << g.t << ", " << g.h << ", " << g.w
                   << ") must be positive, its height and width multiples of "
                      "spatial_merge_size "
                   << merge);
    patches += g.patches();
  }
  KILN_CHECK(
      pixel_values.dim() == 2 && pixel_values.size(0) == patches && pixel_values.size(1) == c.patch_values(),
      "Qwen2_5_VLVisionModel: pixel_values " << shape_str(pixel_values.shape()) << " should be [" << patches
                                             << ", " << c.patch_values()
                                             << "] (the grids' patches, C * T * P * P values each)");
  const VisionLayout layout = vision_layout(grids, merge, c.window_size, c.patch_size);
  // The patch order the blocks run in: merged patches in window order, each one's unit patches together.
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(patches));
  for (int64_t m : layout.window_order) {
    for (int64_t j = 0; j < unit; ++j) order.push_back(m * unit + j);
  }
  const auto [cos, sin] = vision_rope(layout, order, c.head_dim(), c.rope_theta);

  const DType dtype = patch_weight_.dtype();
  const Tensor embedded = linear(on_weights_device(pixel_values).to(dtype).contiguous(),
                                 patch_weight_.reshape({c.hidden_size, c.patch_values()}));
  const Tensor window_index = on_weights_device(index_tensor(layout.window_order));
  Tensor x = embedding(embedded.reshape({patches / unit, unit * c.hidden_size}), window_index)
                 .reshape({patches, c.hidden_size});
  const Tensor cos_d = on_weights_device(cos), sin_d = on_weights_device(sin);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const bool full = std::find(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(),
                                static_cast<int64_t>(i)) != c.fullatt_block_indexes.end();
    x = blocks_[i]->forward(x, cos_d, sin_d, full ? layout.frame_lengths : layout.window_lengths);
  }
  const Tensor merged =
      merger_fc2_(gelu(merger_fc1_(ln_q_(x).reshape({patches / unit, unit * c.hidden_size}))));
  // Back to the processor's order: merged patch m ran at position p where window_order[p] = m.
  std::vector<int64_t> reverse(layout.window_order.size());
  for (size_t p = 0; p < reverse.size(); ++p) reverse[static_cast<size_t>(layout.window_order[p])] = p;
  return embedding(merged, on_weights_device(index_tensor(reverse)));
}

std::unique_ptr<Qwen2_5_VLVisionModel> load_qwen2_5_vl_vision(const std::string& folder, DType dtype) {
  const auto config = Qwen2_5_VLVisionConfig::from_file(folder + "/config.json");
  nn::CheckpointWeights weights(folder);
  return load_qwen2_5_vl_vision(config, weights, dtype);
}

std::unique_ptr<Qwen2_5_VLVisionModel> load_qwen2_5_vl_vision(const Qwen2_5_VLVisionConfig& config,
                                                              const nn::WeightSource& weights, DType dtype) {
  auto model = std::make_unique<Qwen2_5_VLVisionModel>(config);
  nn::LoadOptions options;
  options.dtype = dtype;
  // The language model and its head are the text encoder's (DecoderTextEncoder).
  for (const char* p :
       {"model.language_model.", "model.embed_tokens.", "model.layers.", "model.norm.", "lm_head."}) {
    options.ignore_prefixes.push_back(p);
  }
  const nn::RenamedWeights renamed(weights, [](const std::string& name) {
    for (const std::string prefix : {"model.visual.", "visual."}) {
      if (name.rfind(prefix, 0) == 0) return name.substr(prefix.size());
    }
    return name;
  });
  model->load_weights(renamed, options);
  return model;
}

}  // namespace kiln::models
