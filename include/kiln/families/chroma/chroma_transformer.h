// ChromaTransformer2DModel (lodestones' Chroma1-HD, -Base, -Flash), the denoiser of diffusers'
// ChromaPipeline: FLUX.1-schnell's transformer (the same blocks, names and math) with every block's
// modulation made at once by a small MLP, the distilled-guidance approximator, from the timestep alone: no
// pooled text, no guidance embedding, no per-block modulation weights. Its attention takes a mask over the
// text's padding.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/io/json_config.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/module.h"
#include "kiln/nn/step_cache.h"

namespace kiln::models {

struct FluxTransformerConfig;

// The component's config.json. Absent keys take the defaults of diffusers' ChromaTransformer2DModel.__init__,
// which are Chroma1's values; "out_channels": null means in_channels.
struct ChromaTransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  int64_t out_channels = 64;
  int64_t num_layers = 19;
  int64_t num_single_layers = 38;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};
  int64_t approximator_num_channels = 64;
  int64_t approximator_hidden_dim = 5120;
  int64_t approximator_layers = 5;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  // The modulation vectors the approximator makes: shift, scale and gate for each single-stream block, six
  // per stream for each double-stream block, and the final norm's shift and scale.
  int64_t modulation_rows() const { return 3 * num_single_layers + 12 * num_layers + 2; }
  // The FLUX.1 transformer it shares its blocks with (no pooled projection, no guidance embedding).
  FluxTransformerConfig backbone() const;

  // Reads a parsed config.json: "_class_name" must be ChromaTransformer2DModel; a key this implementation
  // does not know is an error (it could change the architecture). The result is validated.
  static ChromaTransformerConfig from_config(const io::JsonConfig& config);
  static ChromaTransformerConfig from_json(const std::string& text,
                                           const std::string& source = "config.json");
  // `path`: a config.json file, or a component folder holding one.
  static ChromaTransformerConfig from_file(const std::string& path);
  // Throws kiln::Error naming `source` when the values cannot describe a model Kiln runs.
  void validate(const std::string& source = "config.json") const;
};

class ChromaApproximator;
class ChromaTransformerBlock;
class ChromaSingleTransformerBlock;

class ChromaTransformer2DModel : public nn::Module {
 public:
  // Every parameter registered under its diffusers name. With `tp` (size > 1) the blocks are sharded as
  // FLUX.1's (models/dit_layers.h), the approximator's residual MLPs column/row-parallel; every rank returns
  // the full output.
  explicit ChromaTransformer2DModel(const ChromaTransformerConfig& config, const nn::TensorParallel& tp = {});
  ~ChromaTransformer2DModel() override;

  // One denoising evaluation, as ChromaTransformer2DModel.forward(return_dict=False)[0]:
  //   hidden [B, N, in_channels]           packed latents, in the compute dtype (the weights')
  //   encoder_hidden [B, L, joint_attention_dim]   same dtype
  //   timestep [B]                         t / 1000 as the pipeline passes it (cast to the compute dtype and
  //                                        multiplied by 1000 here, as diffusers does)
  //   txt_ids [L, 3], img_ids [N, 3]       RoPE positions (flux_text_ids, flux_latent_image_ids)
  //   attention_mask [B, L + N] or undefined   1 for the tokens kept, 0 for padding; as diffusers 0.42, each
  //                                        block adds m_i * m_j to the attention scores (padding is
  //                                        down-weighted, not removed: huggingface/diffusers#11724)
  // -> [B, N, out_channels] in the compute dtype.
  Tensor forward(const Tensor& hidden, const Tensor& encoder_hidden, const Tensor& timestep,
                 const Tensor& txt_ids, const Tensor& img_ids, const Tensor& attention_mask) const;
  // The approximator's input [B, M, approximator_num_channels] for timestep [B] (t / 1000), and its output,
  // every block's modulation [B, M, inner_dim] (diffusers' input_vec and pooled_temb).
  Tensor approximator_input(const Tensor& timestep) const;
  Tensor modulations(const Tensor& timestep) const;

  bool supports_compile() const override { return true; }
  // The double-stream transformer_blocks, then the single_transformer_blocks.
  std::vector<nn::BlockList> repeated_blocks() const override;
  // Step caching (kiln/nn/step_cache.h), as diffusers 0.42.1's hooks run on Chroma: TaylorSeer, Pyramid
  // Attention Broadcast and FasterCache on every attention (transformer_blocks.N.attn,
  // single_transformer_blocks.N.attn). First Block Cache and MagCache are refused
  // (chroma_block_cache_refusal).
  nn::StepCache* step_cache() const override { return &step_cache_; }
  const ChromaTransformerConfig& config() const { return config_; }

  // diffusers' ChromaTransformer2DModel.from_single_file: Chroma as lodestones ship it, one .safetensors (or
  // a GGUF made from it) in the original layout (kiln/families/chroma/chroma_single_file.h).
  struct SingleFileOptions {
    std::string config;  // a config.json or a folder holding one; empty: read off the file's shapes
    DType dtype = bfloat16;
  };
  static std::unique_ptr<ChromaTransformer2DModel> from_single_file(const std::string& path,
                                                                    const SingleFileOptions& options);

 private:
  Tensor forward_eager(const Tensor& hidden, const Tensor& encoder_hidden, const Tensor& timestep,
                       const Tensor& txt_ids, const Tensor& img_ids, const Tensor& attention_mask) const;
  mutable nn::StepCache step_cache_;  // a call's state; calls to a pipeline are served one at a time
  ChromaTransformerConfig config_;
  std::unique_ptr<ChromaApproximator> distilled_guidance_layer_;
  nn::Linear context_embedder_;
  nn::Linear x_embedder_;
  std::vector<std::unique_ptr<ChromaTransformerBlock>> transformer_blocks_;
  std::vector<std::unique_ptr<ChromaSingleTransformerBlock>> single_transformer_blocks_;
  nn::Linear proj_out_;
};

// Why First Block Cache and MagCache (`cache`: either config) are refused on Chroma: diffusers 0.42.1 cannot
// run them there (Chroma's blocks are not in its TransformerBlockRegistry, so enable_cache fails with "not
// registered"), so there are no decisions or image of diffusers' to match. The message names the caches that
// do run.
std::string chroma_block_cache_refusal(const StepCacheConfig& cache);

// The model of `folder` (a diffusers transformer/ component) with its weights in `dtype`; with `tp`, this
// rank's slices only.
std::unique_ptr<ChromaTransformer2DModel> load_chroma_transformer(const std::string& folder, DType dtype,
                                                                  const nn::TensorParallel& tp = {});

}  // namespace kiln::models
