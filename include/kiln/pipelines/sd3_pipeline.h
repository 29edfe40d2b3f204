// StableDiffusion3Pipeline: Stable Diffusion 3 / 3.5 (Medium, Large, Large Turbo) text-to-image, as
// diffusers' StableDiffusion3Pipeline, from a diffusers folder or a Hugging Face repo id in the local cache:
//
//   auto pipe = kiln::StableDiffusion3Pipeline::from_pretrained("stabilityai/stable-diffusion-3.5-medium",
//                                                               {.dtype = kiln::bfloat16});
//   auto result = pipe({.prompt = "a capybara reading a book", .negative_prompt = "blurry",
//                       .num_inference_steps = 40, .guidance_scale = 4.5f, .generator = kiln::Generator(0)});
//   result.images[0].save("output.png");
//
// Prompts are encoded by CLIP-L and CLIP-G (penultimate hidden states, projected pooled vectors) and T5; with
// guidance_scale > 1 the negative prompt ("" when absent) and the prompt run through the transformer as one
// batch of 2 (classifier-free guidance), optionally with diffusers' skip-layer guidance. The same seed gives
// diffusers' initial noise and every stage follows diffusers' dtype path, so the image matches diffusers'.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/pipelines/flux_pipeline.h"  // PipelineLoadOptions, PipelineOutput
#include "kiln/pipelines/generator.h"
#include "kiln/pipelines/image.h"
#include "kiln/pipelines/offload.h"

namespace kiln {

namespace models {
class SD3Transformer2DModel;
}  // namespace models

struct StableDiffusion3PipelineCall {
  std::string prompt;
  std::optional<std::string> prompt_2;  // CLIP-G's prompt; `prompt` when absent or empty (as diffusers)
  std::optional<std::string> prompt_3;  // T5's prompt; likewise
  std::optional<std::string> negative_prompt;  // "" when absent; used only with guidance_scale > 1
  std::optional<std::string> negative_prompt_2, negative_prompt_3;  // negative_prompt when absent or empty
  int64_t height = 0;  // 0: the model's default, transformer sample_size * VAE scale factor (1024 for SD3.5)
  int64_t width = 0;
  int num_inference_steps = 28;
  float guidance_scale = 7.0f;         // classifier-free guidance is on when > 1
  std::optional<Generator> generator;  // torch's default seed when absent
  int64_t max_sequence_length = 256;   // T5 tokens (at most 512)
  int num_images_per_prompt = 1;
  // Skip-layer guidance (off when empty; diffusers recommends {7, 8, 9} for 3.5 Medium). Active at steps i
  // with steps * start < i < steps * stop, and only with classifier-free guidance.
  std::vector<int64_t> skip_guidance_layers;
  double skip_layer_guidance_scale = 2.8;
  double skip_layer_guidance_start = 0.01;
  double skip_layer_guidance_stop = 0.2;
  // Called after each denoising step with (step index from 0, total steps, seconds the step took).
  std::function<void(int, int, double)> on_step_end;
};

class StableDiffusion3Pipeline {
 public:
  // `model` is a diffusers folder or a repo id ("stabilityai/stable-diffusion-3.5-large") in the local HF
  // cache. text_encoder_3 / tokenizer_3 may be absent ([null, null]): T5's embeddings are then zeros, as in
  // diffusers.
  static StableDiffusion3Pipeline from_pretrained(const std::string& model,
                                                  const PipelineLoadOptions& options = {});
  StableDiffusion3Pipeline(StableDiffusion3Pipeline&&) noexcept;
  StableDiffusion3Pipeline& operator=(StableDiffusion3Pipeline&&) noexcept;
  ~StableDiffusion3Pipeline();

  PipelineOutput operator()(const StableDiffusion3PipelineCall& call);

  // ---- the stages, as diffusers names them (public so each can be checked against diffusers)
  // One prompt through the three encoders (encode_prompt without the negative branch). Each tensor is
  // repeated num_images_per_prompt times along the batch.
  struct TextEmbeddings {
    Tensor prompt_embeds;  // [N, 77 + max_sequence_length, joint_attention_dim]: CLIP (zero-padded), T5
    Tensor pooled_prompt_embeds;          // [N, projection_L + projection_G]
    Tensor clip_l_hidden, clip_l_pooled;  // hidden_states[-2] [N, 77, D_L] and text_embeds [N, P_L]
    Tensor clip_g_hidden, clip_g_pooled;
    Tensor t5_hidden;  // [N, max_sequence_length, d_model] (zeros without text_encoder_3)
    std::vector<int64_t> clip_l_ids, clip_g_ids, t5_ids;  // the token ids (t5_ids empty without tokenizer_3)
  };
  TextEmbeddings encode_text(const std::string& prompt, const std::string& prompt_2,
                             const std::string& prompt_3, int num_images_per_prompt,
                             int64_t max_sequence_length) const;
  // The positive prompt's embeddings, and with guidance_scale > 1 the negative prompt's.
  struct PromptEmbeddings {
    TextEmbeddings positive;
    std::optional<TextEmbeddings> negative;
  };
  PromptEmbeddings encode_prompt(const StableDiffusion3PipelineCall& call) const;
  // Noise [batch, in_channels, height / 8, width / 8], drawn as diffusers' prepare_latents does.
  Tensor prepare_latents(int64_t batch, int64_t height, int64_t width, DType dtype,
                         Generator& generator) const;
  // The velocity the scheduler steps with at denoising step `step` (timestep t): one transformer pass,
  // batched [negative; positive] and combined with the guidance scale when guidance is on, plus skip-layer
  // guidance when the call asks for it at this step.
  Tensor predict_velocity(const Tensor& latents, float timestep, int step, const PromptEmbeddings& prompt,
                          const StableDiffusion3PipelineCall& call) const;
  // Latents -> float image [B, H, W, 3] in [0, 1] (diffusers' output_type="np").
  Tensor decode_latents(const Tensor& latents) const;

  const models::SD3Transformer2DModel& transformer() const { return *transformer_; }
  // For compiled mode: pipe.transformer().compile({...}) or .compile_repeated_blocks().
  models::SD3Transformer2DModel& transformer() { return *transformer_; }
  // diffusers' enable_vae_tiling / disable_vae_tiling: the VAE decodes latents larger than a tile in
  // overlapping, blended tiles. `tile_size` in pixels; 0 keeps the VAE's sample_size (1024 for FLUX.1 and
  // SD3, so only larger images tile unless a smaller size is given).
  void enable_vae_tiling(int64_t tile_size = 0);
  void disable_vae_tiling();
  DType dtype() const { return dtype_; }
  const std::string& model_path() const { return path_; }
  // How the weights are held (applied when loading ended).
  const WeightPackingPlan& weight_packing() const { return weight_packing_; }
  // diffusers' enable_model_cpu_offload: each component holds its weights only while it runs. On a host
  // without an accelerator the weights live in the memory-mapped checkpoint; once a component has run, its
  // packed copies are freed and its file pages handed back (page cache included), so the memory goes to the
  // component that runs next (Module::release_weights). The image does not change; later calls read the
  // weights from the file again. KILN_LOG=offload says what was released and when.
  // `device` is where each component computes while it runs; detected when not given
  // (default_compute_device()), an error naming it when this build has no backend for it.
  void enable_model_cpu_offload(std::optional<Device> device = std::nullopt);
  bool model_cpu_offload_enabled() const { return model_cpu_offload_; }
  // diffusers' enable_sequential_cpu_offload (kiln/pipelines/offload.h): no packed copies, at most
  // `resident_bytes` of the mapped weights kept in memory (0: each weight released once the next one is
  // read), and model offload between components.
  void enable_sequential_cpu_offload(int64_t resident_bytes = 0);
  // diffusers' enable_group_offload (block level): weights read in place from the mapped checkpoint; each
  // component's repeated blocks in groups of `blocks_per_group`, a group's pages handed back once the next
  // group runs and, with `prefetch`, the group after it brought in on a background thread while the current
  // one computes (kiln/runtime/weight_groups.h); model offload between components. Every execution mode.
  void enable_group_offload(const GroupOffloadOptions& options = {});
  // Applies the coarsest offload that keeps the weights under `bytes` (plan_offload); throws before any work
  // when even the largest weight does not fit. Activations come on top.
  OffloadPlan set_memory_budget(int64_t bytes);
  // diffusers' pipe.to(device): every component resident on `device`, any offloading turned off (the weights
  // packed as weight_packing() says). This build runs on the CPU only; another device is an error naming it.
  void to(const Device& device);
  // The image size a call with height = width = 0 gets.
  int64_t default_image_size() const;

 private:
  StableDiffusion3Pipeline();
  std::vector<std::pair<std::string, nn::Module*>> components() const;
  StableDiffusion3PipelineCall resolved(
      const StableDiffusion3PipelineCall& call) const;  // defaults filled, checked

  std::string path_;
  std::string name_;  // what the user asked for (repo id or folder), recorded in image metadata
  DType dtype_ = float32;
  WeightPackingPlan weight_packing_;
  bool model_cpu_offload_ = false;
  std::unique_ptr<tokenizers::ClipTokenizer> tokenizer_, tokenizer_2_;
  std::unique_ptr<tokenizers::T5Tokenizer> tokenizer_3_;  // null when the pipeline has no T5
  std::unique_ptr<models::ClipTextModel> text_encoder_, text_encoder_2_;
  std::unique_ptr<models::T5EncoderModel> text_encoder_3_;
  std::unique_ptr<models::SD3Transformer2DModel> transformer_;
  std::unique_ptr<models::AutoencoderKL> vae_;
  std::unique_ptr<FlowMatchEulerDiscreteScheduler> scheduler_;
};

}  // namespace kiln
