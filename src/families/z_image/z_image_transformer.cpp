#include "kiln/families/z_image/z_image_transformer.h"

#include <map>

#include "families/z_image/z_image_blocks.h"
#include "families/z_image/z_image_single_file.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/nn/weight_file.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "kiln/ops/nn.h"
#include "models/dit_layers.h"
#include "models/flux_embeddings.h"

namespace kiln::models {

namespace {

constexpr int64_t kSequenceMultiple = 32;     // SEQ_MULTI_OF: each token run padded to a multiple of it
constexpr int64_t kFrequencyEmbedding = 256;  // TimestepEmbedder's frequency_embedding_size
constexpr int64_t kTimestepMid = 1024;        // TimestepEmbedder's mid_size
constexpr double kFinalNormEps = 1e-6;

int64_t padded(int64_t n) {
  return n + (kSequenceMultiple - n % kSequenceMultiple) % kSequenceMultiple;
}

std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : std::string("undefined");
}

}  // namespace

ZImageTransformer2DModel::ZImageTransformer2DModel(const ZImageTransformerConfig& config,
                                                   const nn::TensorParallel& tp)
    // The heads are what tensor parallelism splits: a degree that does not divide them is refused by name
    // first.
    : config_((config.validate("ZImageTransformer2DModel config"),
               tp.split(config.n_heads, "ZImageTransformer2DModel n_heads"), config)),
      x_embedder_(config.patch_features(), config.dim, true, nn::column_gathered(tp)),
      t_embedder_1_(kFrequencyEmbedding, kTimestepMid, true),
      t_embedder_2_(kTimestepMid, config.adaln_dim(), true),
      cap_norm_(config.cap_feat_dim, config.norm_eps),
      cap_linear_(config.cap_feat_dim, config.dim, true, nn::column_gathered(tp)),
      final_modulation_(config.adaln_dim(), config.dim, true, nn::column_gathered(tp)),
      final_linear_(config.dim, config.patch_features(), true) {
  const ZImageTransformerConfig& c = config_;
  const std::string patch = std::to_string(c.patch_size()) + "-" + std::to_string(c.all_f_patch_size.front());
  register_module("all_x_embedder." + patch, &x_embedder_);
  const auto make = [&](std::vector<std::unique_ptr<ZImageTransformerBlock>>& list, const std::string& name,
                        int64_t count, bool modulation) {
    for (int64_t i = 0; i < count; ++i) {
      list.push_back(std::make_unique<ZImageTransformerBlock>(c.dim, c.n_heads, c.ffn_hidden(), c.norm_eps,
                                                              modulation, c.adaln_dim(), tp));
      register_module(name + "." + std::to_string(i), list.back().get());
    }
  };
  make(noise_refiner_, "noise_refiner", c.n_refiner_layers, true);
  make(context_refiner_, "context_refiner", c.n_refiner_layers, false);
  register_module("t_embedder.mlp.0", &t_embedder_1_);
  register_module("t_embedder.mlp.2", &t_embedder_2_);
  register_module("cap_embedder.0", &cap_norm_);
  register_module("cap_embedder.1", &cap_linear_);
  register_parameter("x_pad_token", &x_pad_token_, {1, c.dim});
  register_parameter("cap_pad_token", &cap_pad_token_, {1, c.dim});
  make(layers_, "layers", c.n_layers, true);
  register_module("all_final_layer." + patch + ".linear", &final_linear_);
  register_module("all_final_layer." + patch + ".adaLN_modulation.1", &final_modulation_);
}

ZImageTransformer2DModel::~ZImageTransformer2DModel() = default;

std::vector<nn::BlockList> ZImageTransformer2DModel::repeated_blocks() const {
  return {nn::block_list("noise_refiner", noise_refiner_),
          nn::block_list("context_refiner", context_refiner_), nn::block_list("layers", layers_)};
}

Tensor ZImageTransformer2DModel::timestep_embedding(const Tensor& timestep) const {
  // t_embedder(t * t_scale): [cos, sin] of the 256-wide sinusoid in float32, cast to the weights' dtype, MLP.
  const Tensor scaled = mul(on_weights_device(timestep).to(float32), config_.t_scale);
  const Tensor freq = flux_timestep_sinusoid(scaled, kFrequencyEmbedding).to(t_embedder_1_.dtype());
  return t_embedder_2_(silu(t_embedder_1_(freq)));
}

Tensor ZImageTransformer2DModel::forward(const Tensor& latents, const Tensor& timestep,
                                         const std::vector<Tensor>& captions) const {
  const ZImageTransformerConfig& c = config_;
  const char* op = "ZImageTransformer2DModel";
  KILN_CHECK(x_embedder_.weight.defined(), op << ": the weights are not loaded (call load_weights first)");
  KILN_CHECK(latents.defined() && latents.dim() == 4 && latents.size(1) == c.in_channels &&
                 latents.size(2) % c.patch_size() == 0 && latents.size(3) % c.patch_size() == 0,
             op << ": expected latents [B, " << c.in_channels << ", H, W] with H and W multiples of "
                << c.patch_size() << ", got " << describe(latents));
  const int64_t batch = latents.size(0);
  KILN_CHECK(
      timestep.defined() && timestep.dim() == 1 && timestep.size(0) == batch && is_floating(timestep.dtype()),
      op << ": expected a floating timestep [" << batch << "], got " << describe(timestep));
  KILN_CHECK(
      static_cast<int64_t>(captions.size()) == batch,
      op << ": expected " << batch << " caption feature tensors (one per latent), got " << captions.size());
  // Items grouped by their padded caption length: each group is one batch with no padding between items.
  std::map<int64_t, std::vector<int64_t>> groups;
  for (int64_t i = 0; i < batch; ++i) {
    const Tensor& cap = captions[static_cast<size_t>(i)];
    KILN_CHECK(cap.defined() && cap.dim() == 2 && cap.size(0) > 0 && cap.size(1) == c.cap_feat_dim,
               op << ": expected caption features [L, " << c.cap_feat_dim << "] with L > 0 for item " << i
                  << ", got " << describe(cap));
    groups[padded(cap.size(0))].push_back(i);
  }
  std::vector<Tensor> outputs(static_cast<size_t>(batch));
  for (const auto& [length, items] : groups) {
    std::vector<Tensor> x, t, cap, kept;
    for (int64_t i : items) {
      const Tensor& feats = captions[static_cast<size_t>(i)];
      const int64_t tokens = feats.size(0);
      x.push_back(latents.narrow(0, i, 1));
      t.push_back(timestep.narrow(0, i, 1));
      // The padding's values never matter (the pad token replaces them): zeros.
      cap.push_back((tokens == length ? feats
                                      : concat({feats, Tensor::zeros({length - tokens, c.cap_feat_dim},
                                                                     feats.dtype(), feats.device())},
                                               0))
                        .unsqueeze(0));
      std::vector<float> mask(static_cast<size_t>(length), 0.0f);
      std::fill_n(mask.begin(), tokens, 1.0f);
      kept.push_back(Tensor::from_vector(mask, {1, length}));
    }
    const bool whole = static_cast<int64_t>(items.size()) == batch;
    const Tensor out = forward_padded(whole ? latents : concat(x, 0), whole ? timestep : concat(t, 0),
                                      concat(cap, 0), concat(kept, 0));
    if (whole) return out;
    for (size_t k = 0; k < items.size(); ++k)
      outputs[static_cast<size_t>(items[k])] = out.narrow(0, static_cast<int64_t>(k), 1);
  }
  return concat(outputs, 0);
}

Tensor ZImageTransformer2DModel::forward_padded(const Tensor& latents, const Tensor& timestep,
                                                const Tensor& caption, const Tensor& caption_kept) const {
  std::vector<Tensor> inputs{latents, timestep, caption, caption_kept};
  for (Tensor& t : inputs) t = on_weights_device(t);
  const auto eager = [this](const std::vector<Tensor>& in) {
    return forward_eager(in[0], in[1], in[2], in[3]);
  };
  if (!is_compiled()) return eager(inputs);
  return call_compiled(inputs, [&](const auto& in) { return std::vector<Tensor>{eager(in)}; })[0];
}

Tensor ZImageTransformer2DModel::forward_eager(const Tensor& latents, const Tensor& timestep,
                                               const Tensor& caption, const Tensor& caption_kept) const {
  const ZImageTransformerConfig& c = config_;
  const char* op = "ZImageTransformer2DModel";
  const DType dtype = x_embedder_.dtype();
  KILN_CHECK(latents.dtype() == dtype && caption.dtype() == dtype,
             op << ": latents and caption features are " << dtype_name(latents.dtype()) << " and "
                << dtype_name(caption.dtype()) << " but the weights are " << dtype_name(dtype)
                << "; the model computes in its weights' dtype");
  const int64_t batch = latents.size(0), p = c.patch_size();
  const int64_t rows = latents.size(2) / p, columns = latents.size(3) / p;
  const int64_t image = rows * columns, image_padded = padded(image), text = caption.size(1);
  // RoPE positions: the caption's tokens (pads included) at (1 + i, 0, 0); the image's patches at
  // (caption length + 1, row, column), its pad tokens at (0, 0, 0).
  KILN_CHECK(text + 1 < c.axes_lens[0] && rows <= c.axes_lens[1] && columns <= c.axes_lens[2],
             op << ": " << text << " caption tokens and " << rows << " x " << columns
                << " patches exceed the model's RoPE positions (axes_lens " << c.axes_lens[0] << ", "
                << c.axes_lens[1] << ", " << c.axes_lens[2] << ")");
  std::vector<std::array<int64_t, 3>> image_ids, text_ids;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t col = 0; col < columns; ++col) image_ids.push_back({text + 1, r, col});
  image_ids.resize(static_cast<size_t>(image_padded), {0, 0, 0});
  for (int64_t i = 0; i < text; ++i) text_ids.push_back({1 + i, 0, 0});
  const ZImageRope image_rope = z_image_rope(image_ids, c.axes_dims, c.rope_theta);
  const ZImageRope text_rope = z_image_rope(text_ids, c.axes_dims, c.rope_theta);
  const Tensor image_cos = on_weights_device(image_rope.cos), image_sin = on_weights_device(image_rope.sin);
  const Tensor text_cos = on_weights_device(text_rope.cos), text_sin = on_weights_device(text_rope.sin);

  const Tensor adaln = timestep_embedding(timestep).to(dtype);
  // Patches [B, N, p * p * C], each (row in patch, column in patch, channel), embedded; then the pad token.
  Tensor x = x_embedder_(latents.view({batch, c.in_channels, rows, p, columns, p})
                             .permute({0, 2, 4, 3, 5, 1})
                             .reshape({batch, image, c.patch_features()}));
  if (image_padded > image)
    x = concat({x, x_pad_token_.to(dtype).unsqueeze(0).expand({batch, image_padded - image, c.dim})}, 1);
  for (const auto& block : noise_refiner_) x = block->forward(x, image_cos, image_sin, adaln);

  Tensor cap = cap_linear_(cap_norm_(caption));
  cap = where(gt(caption_kept, 0.5).unsqueeze(2), cap, cap_pad_token_.to(dtype).unsqueeze(0));
  for (const auto& block : context_refiner_) cap = block->forward(cap, text_cos, text_sin, Tensor());

  // The main layers over [image | caption].
  Tensor unified = concat({x, cap}, 1);
  const Tensor cos = concat({image_cos, text_cos}, 0), sin = concat({image_sin, text_sin}, 0);
  for (const auto& block : layers_) unified = block->forward(unified, cos, sin, adaln);

  // FinalLayer: LayerNorm (no affine) times 1 + Linear(SiLU(c)), then the patch projection.
  const Tensor scale = add(1.0, final_modulation_(silu(adaln))).unsqueeze(1);
  const Tensor out = final_linear_(mul(layer_norm_plain(unified.narrow(1, 0, image), kFinalNormEps), scale));
  return out.view({batch, rows, columns, p, p, c.in_channels})
      .permute({0, 5, 1, 3, 2, 4})
      .reshape({batch, c.in_channels, rows * p, columns * p});
}

std::unique_ptr<ZImageTransformer2DModel> load_z_image_transformer(const std::string& folder, DType dtype,
                                                                   const nn::TensorParallel& tp) {
  auto model = std::make_unique<ZImageTransformer2DModel>(ZImageTransformerConfig::from_file(folder), tp);
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(nn::CheckpointWeights(folder), options);
  return model;
}

std::unique_ptr<ZImageTransformer2DModel> ZImageTransformer2DModel::from_single_file(
    const std::string& path, const SingleFileOptions& options) {
  std::shared_ptr<const nn::WeightSource> file = nn::open_weight_file(path);
  KILN_CHECK(
      is_z_image_single_file(*file),
      path << ": not a Z-Image transformer in the original layout (no layers.0.adaLN_modulation.0.weight and "
              "layers.0.attention.qkv.weight, with or without model.diffusion_model.); a file of another "
              "family?");
  const ZImageTransformerConfig config = options.config.empty()
                                             ? infer_z_image_config(*file)
                                             : ZImageTransformerConfig::from_file(options.config);
  auto model = std::make_unique<ZImageTransformer2DModel>(config);
  nn::LoadOptions load;
  load.dtype = options.dtype;
  load.ignore_prefixes = z_image_single_file_ignored(*file);
  model->load_weights(*z_image_single_file_weights(file, config), load);
  return model;
}

}  // namespace kiln::models
