// Flux2Pipeline (FLUX.2-dev) and Flux2KleinPipeline (FLUX.2 [klein] 4B / 9B): text-to-image, optionally
// conditioned on reference images, as diffusers' pipelines of those names, from a diffusers folder or a
// Hugging Face repo id in the local cache:
//
//   auto pipe = kiln::Flux2Pipeline::from_pretrained("black-forest-labs/FLUX.2-dev",
//                                                    {.dtype = kiln::bfloat16});
//   auto result = pipe({.prompt = "a golden retriever surfing a wave", .height = 1024, .width = 1024,
//                       .num_inference_steps = 50, .guidance_scale = 4.0f, .generator = kiln::Generator(0)});
//   result.images[0].save("output.png");
//
// They take prompt or prompt_embeds, reference images (image: each at least 64 pixels a side with an aspect
// ratio up to 8, resized to 1024 x 1024 pixels of area when larger, then centre-cropped to multiples of 16),
// the size (default: the first reference image's, else 1024 x 1024), steps (50), guidance (4.0),
// generator, num_images_per_prompt and max_sequence_length (512) of a PipelineRequest; klein also its
// negative prompt (negative_prompt or negative_prompt_embeds; "" as in diffusers when absent).
//
// The same seed gives diffusers' initial noise (drawn in the patchified 128-channel shape), the schedule uses
// diffusers' empirical mu, and every stage follows diffusers' dtype path, so Kiln's image matches diffusers'.
//
// Prompts: from_pretrained loads the folder's text_encoder/ and tokenizer/ when model_index.json lists them
// (Mistral3ForConditionalGeneration + PixtralProcessor for FLUX.2-dev, Qwen3ForCausalLM + Qwen2Tokenizer for
// klein; kiln/models/flux2_prompt_encoder.h), so `prompt` works as in diffusers. A folder saved without them
// ([null, null]) takes `prompt_embeds`, as diffusers' __call__(prompt_embeds=...) does, or a prompt encoder
// installed with set_prompt_encoder.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/pipelines/generator.h"

namespace kiln {

namespace pipelines {
struct ResolvedRequest;
}  // namespace pipelines

namespace models {
class Flux2Transformer2DModel;
class AutoencoderKLFlux2;
}  // namespace models
class FlowMatchEulerDiscreteScheduler;
class Flux2PromptEncoder;

// The shared implementation of both pipelines (they differ in their text encoders and in how they guide).
class Flux2PipelineBase : public DiffusionPipeline {
 public:
  Flux2PipelineBase(Flux2PipelineBase&&) noexcept;
  Flux2PipelineBase& operator=(Flux2PipelineBase&&) noexcept;
  ~Flux2PipelineBase() override;

  PipelineDefaults family_defaults() const override;

  // The text side, when the folder has one: the tokenizer and the text encoder's layers the pipeline reads
  // (null for a folder saved without them).
  const Flux2PromptEncoder* prompt_encoder() const { return text_side_.get(); }
  // For compiled mode: pipe.prompt_encoder()->text_encoder().compile_repeated_blocks().
  Flux2PromptEncoder* prompt_encoder() { return text_side_.get(); }
  // A prompt encoder of one's own: prompts -> embeddings [B, L, joint_attention_dim] in the pipeline's dtype
  // (as diffusers' encode_prompt makes them). It replaces the folder's text encoder for later calls.
  using PromptEncoder =
      std::function<Tensor(const std::vector<std::string>& prompts, int64_t max_sequence_length)>;
  void set_prompt_encoder(PromptEncoder encoder) { custom_prompt_encoder_ = std::move(encoder); }
  bool has_prompt_encoder() const { return custom_prompt_encoder_ != nullptr || text_side_ != nullptr; }

  // ---- the stages, as diffusers names them (public so each can be checked against diffusers)
  // encode_prompt: `prompt_embeds`, or the prompt's embeddings when undefined, repeated num_images_per_prompt
  // times, and their text ids [L, 4].
  // encode_prompts: several prompts as one batch (diffusers' prompt list), each repeated n times in order.
  std::pair<Tensor, Tensor> encode_prompts(const std::vector<std::string>& prompts,
                                           const Tensor& prompt_embeds, int num_images_per_prompt,
                                           int64_t max_sequence_length) const;
  std::pair<Tensor, Tensor> encode_prompt(const std::string& prompt, const Tensor& prompt_embeds,
                                          int num_images_per_prompt, int64_t max_sequence_length) const;
  // Packed noise [B, N, in_channels] and its ids [N, 4], drawn as diffusers' prepare_latents does (in the
  // patchified shape [B, in_channels, H / 16, W / 16], then packed).
  std::pair<Tensor, Tensor> prepare_latents(int64_t batch, int64_t height, int64_t width, DType dtype,
                                            Generator& generator) const;
  // With diffusers' generator list: image i's noise from generators[i] (one generator: the whole batch).
  std::pair<Tensor, Tensor> prepare_latents(int64_t batch, int64_t height, int64_t width, DType dtype,
                                            const std::vector<Generator*>& generators) const;
  // A reference image as the pipeline preprocesses it: [1, 3, h, w] float32 in [-1, 1] (resized when its area
  // exceeds 1024^2, centre-cropped to multiples of 16).
  Tensor preprocess_image(const Image& image) const;
  // prepare_image_latents: every preprocessed image encoded (the latent mean), patchified, normalised by the
  // VAE's BatchNorm statistics and packed, the images one after another, repeated `batch` times
  // -> [batch, N_ref, in_channels], and their ids [N_ref, 4] (image i at time coordinate 10 + 10 i).
  std::pair<Tensor, Tensor> prepare_image_latents(const std::vector<Tensor>& images, int64_t batch) const;
  // Packed latents [B, N, C] of an H x W image -> float image [B, H, W, 3] in [0, 1] (output_type="np").
  Tensor decode_latents(const Tensor& latents, int64_t height, int64_t width) const;

  const models::Flux2Transformer2DModel& transformer() const { return *transformer_; }
  // For compiled mode: pipe.transformer().compile({...}) or .compile_repeated_blocks().
  models::Flux2Transformer2DModel& transformer() { return *transformer_; }
  const models::AutoencoderKLFlux2& vae() const { return *vae_; }
  std::vector<std::pair<std::string, nn::Module*>> components() const override;
  nn::Module& denoiser() override;
  ActivationEstimate estimate_activations(const PipelineRequest& request,
                                          const Device& device) const override;

 protected:
  enum class Variant { Dev, Klein };
  explicit Flux2PipelineBase(Variant variant);
  // Loads the scheduler, tokenizer, text encoder, transformer and VAE of `model` (model_index class
  // `pipeline_class`); the text encoder and tokenizer are both listed or both [null, null].
  void load(const std::string& model, const PipelineLoadOptions& options, const char* pipeline_class);
  models::LatentCodec& latent_codec() const override;
  // The latents [B, C, h, w] as the transformer's tokens [B, h * w, C] (diffusers' _pack_latents).
  static Tensor tokens(const Tensor& latents);
  const char* name() const { return class_name(); }

  Variant variant_;
  bool is_distilled_ = false;  // klein: model_index.json's is_distilled (no classifier-free guidance)

 private:
  // The call's checks that do not depend on the reference images (sizes given, prompts, steps, ...).
  void check_loaded_request(const PipelineRequest& request) const override;
  // klein's classifier-free guidance evaluates the negative prompt in calls of its own.
  bool negative_evaluations(const PipelineRequest& request) const override;
  PipelineOutput run(const PipelineRequest& request, const pipelines::CallControl& control) override;
  // The request's values with defaults resolved (the size from the first reference image), its size checked.
  pipelines::ResolvedRequest resolved(const PipelineRequest& request,
                                      const std::vector<Tensor>& references) const;
  bool classifier_free_guidance(float guidance_scale) const;

  std::unique_ptr<Flux2PromptEncoder> text_side_;
  PromptEncoder custom_prompt_encoder_;
  std::unique_ptr<models::Flux2Transformer2DModel> transformer_;
  std::unique_ptr<models::AutoencoderKLFlux2> vae_;
  std::unique_ptr<FlowMatchEulerDiscreteScheduler> scheduler_;
};

// FLUX.2-dev: guidance-distilled, so the guidance scale is embedded (one transformer pass per step).
class Flux2Pipeline : public Flux2PipelineBase {
 public:
  // `model` is a diffusers folder or a repo id ("black-forest-labs/FLUX.2-dev") in the local HF cache.
  static Flux2Pipeline from_pretrained(const std::string& model, const PipelineLoadOptions& options = {});
  const char* class_name() const override { return "Flux2Pipeline"; }

 private:
  Flux2Pipeline() : Flux2PipelineBase(Variant::Dev) {}
};

// FLUX.2 [klein]: no guidance embedding; classifier-free guidance with the negative prompt ("" unless
// given; two transformer passes per step) when guidance_scale > 1, unless model_index.json marks the model
// step-distilled (is_distilled, e.g. klein 4B / 9B as opposed to their -base variants), whose guidance scale
// is ignored.
class Flux2KleinPipeline : public Flux2PipelineBase {
 public:
  static Flux2KleinPipeline from_pretrained(const std::string& model,
                                            const PipelineLoadOptions& options = {});
  const char* class_name() const override { return "Flux2KleinPipeline"; }
  bool is_distilled() const { return is_distilled_; }

 private:
  Flux2KleinPipeline() : Flux2PipelineBase(Variant::Klein) {}
};

}  // namespace kiln
