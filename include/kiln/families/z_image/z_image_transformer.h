// ZImageTransformer2DModel (Tongyi-MAI's Z-Image, Z-Image-Turbo), the denoiser of diffusers' ZImagePipeline:
// a single-stream DiT. The image's 2x2 patches and the caption's tokens are each padded to a multiple of 32
// tokens with a learned pad token and refined on their own (noise_refiner: modulated by the timestep;
// context_refiner: not), then run together ([image | caption]) through the main layers. Each block: RMSNorm'd
// attention with per-head q/k RMSNorm and 3-axis interleaved RoPE (caption tokens at (1 + i, 0, 0), image
// patches at (caption length + 1, row, column)), a SwiGLU feed-forward, sandwich RMSNorms, tanh gates and
// scales from the timestep alone (adaLN without SiLU); the final layer's scale from SiLU(timestep embedding).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/io/json_config.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/module.h"

namespace kiln::models {

// The component's config.json. Absent keys take the defaults of diffusers' ZImageTransformer2DModel.__init__,
// which are Z-Image's (6B) values.
struct ZImageTransformerConfig {
  std::vector<int64_t> all_patch_size = {2};
  std::vector<int64_t> all_f_patch_size = {1};
  int64_t in_channels = 16;
  int64_t dim = 3840;
  int64_t n_layers = 30;
  int64_t n_refiner_layers = 2;
  int64_t n_heads = 30;
  int64_t n_kv_heads = 30;
  double norm_eps = 1e-5;
  bool qk_norm = true;
  int64_t cap_feat_dim = 2560;
  double rope_theta = 256.0;
  double t_scale = 1000.0;
  std::vector<int64_t> axes_dims = {32, 48, 48};
  std::vector<int64_t> axes_lens = {1024, 512, 512};

  int64_t head_dim() const { return dim / n_heads; }
  int64_t patch_size() const { return all_patch_size.front(); }
  // The width of one patch: patch_size^2 * in_channels (f_patch_size 1).
  int64_t patch_features() const { return patch_size() * patch_size() * in_channels; }
  // SwiGLU's hidden width: int(dim / 3 * 8), as diffusers computes it.
  int64_t ffn_hidden() const;
  // The timestep embedding's width: min(dim, 256).
  int64_t adaln_dim() const { return dim < 256 ? dim : 256; }

  // Reads a parsed config.json: "_class_name" must be ZImageTransformer2DModel; a key this implementation
  // does not know is an error (siglip_feat_dim, Z-Image Omni's, is refused by name). The result is validated.
  static ZImageTransformerConfig from_config(const io::JsonConfig& config);
  static ZImageTransformerConfig from_json(const std::string& text,
                                           const std::string& source = "config.json");
  // `path`: a config.json file, or a component folder holding one.
  static ZImageTransformerConfig from_file(const std::string& path);
  void validate(const std::string& source = "config.json") const;
};

class ZImageTransformerBlock;

class ZImageTransformer2DModel : public nn::Module {
 public:
  // Every parameter under its diffusers name. With `tp` (size > 1): q/k/v and w1/w3 column-parallel (each
  // rank attends over its own heads), to_out and w2 row-parallel, the rest replicated; every rank returns the
  // full output. A degree that does not divide n_heads is refused by name.
  explicit ZImageTransformer2DModel(const ZImageTransformerConfig& config, const nn::TensorParallel& tp = {});
  ~ZImageTransformer2DModel() override;

  // One denoising evaluation, as ZImageTransformer2DModel.forward(x, t, cap_feats)[0] for a batch:
  //   latents [B, C, H, W]        in the compute dtype (the weights'), H and W multiples of the patch size
  //   timestep [B]                (1000 - t) / 1000 as the pipeline passes it (times t_scale here)
  //   captions                    B tensors [L_i, cap_feat_dim], each prompt's tokens (the compute dtype)
  // -> [B, C, H, W] in the compute dtype. Items whose padded caption lengths differ run as separate batches
  // (diffusers masks the batch's padding keys instead: the same values).
  Tensor forward(const Tensor& latents, const Tensor& timestep, const std::vector<Tensor>& captions) const;

  // The timestep embedding t_embedder(t * t_scale) [B, adaln_dim] in the compute dtype.
  Tensor timestep_embedding(const Tensor& timestep) const;

  bool supports_compile() const override { return true; }
  // noise_refiner, context_refiner and layers: one compiled program for the modulated blocks of each shape.
  std::vector<nn::BlockList> repeated_blocks() const override;
  const ZImageTransformerConfig& config() const { return config_; }

  // diffusers' ZImageTransformer2DModel.from_single_file: the transformer as ComfyUI ships it, one
  // .safetensors (or a GGUF made from it, whose quantized weights stay quantized) in the original layout.
  struct SingleFileOptions {
    std::string config;  // a config.json or a folder holding one; empty: read off the file's shapes
    DType dtype = bfloat16;
  };
  static std::unique_ptr<ZImageTransformer2DModel> from_single_file(const std::string& path,
                                                                    const SingleFileOptions& options);

 private:
  // One batch whose captions are padded to the same length: caption [B, Lp, cap_feat_dim], caption_kept [B,
  // Lp] float32 (1 for a prompt token, 0 for the padding the pad token replaces).
  Tensor forward_padded(const Tensor& latents, const Tensor& timestep, const Tensor& caption,
                        const Tensor& caption_kept) const;
  Tensor forward_eager(const Tensor& latents, const Tensor& timestep, const Tensor& caption,
                       const Tensor& caption_kept) const;

  ZImageTransformerConfig config_;
  nn::Linear x_embedder_;
  nn::Linear t_embedder_1_, t_embedder_2_;
  nn::RMSNorm cap_norm_;
  nn::Linear cap_linear_;
  Tensor x_pad_token_, cap_pad_token_;
  std::vector<std::unique_ptr<ZImageTransformerBlock>> noise_refiner_, context_refiner_, layers_;
  nn::Linear final_modulation_, final_linear_;
};

// The model of `folder` (a diffusers transformer/ component) with its weights in `dtype`; with `tp`, this
// rank's slices only.
std::unique_ptr<ZImageTransformer2DModel> load_z_image_transformer(const std::string& folder, DType dtype,
                                                                   const nn::TensorParallel& tp = {});

}  // namespace kiln::models
