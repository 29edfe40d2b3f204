// FluxPipeline: FLUX.1-schnell / FLUX.1-dev text-to-image, as diffusers' FluxPipeline, from a diffusers
// folder or a Hugging Face repo id in the local cache:
//
//   auto pipe = kiln::FluxPipeline::from_pretrained("black-forest-labs/FLUX.1-schnell",
//                                                   {.dtype = kiln::bfloat16});
//   auto result = pipe({.prompt = "a golden retriever surfing a wave", .height = 1024, .width = 1024,
//                       .num_inference_steps = 4, .guidance_scale = 0.0f, .generator = kiln::Generator(0)});
//   result.images[0].save("output.png");
//
// It takes prompt and prompt_2 (T5's), the size, steps, guidance (embedded, FLUX.1-dev; schnell ignores it),
// generator, max_sequence_length and num_images_per_prompt of a PipelineRequest; defaults: 1024 x 1024, 28
// steps, guidance 3.5, 512 tokens.
//
// The same seed gives diffusers' initial noise, and every stage follows diffusers' dtype path, so Kiln's
// image matches diffusers' for the same inputs.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/pipelines/generator.h"

namespace kiln {

namespace models {
class ClipTextModel;
class T5EncoderModel;
class FluxTransformer2DModel;
class AutoencoderKL;
}  // namespace models
namespace tokenizers {
class ClipTokenizer;
class T5Tokenizer;
}  // namespace tokenizers
class FlowMatchEulerDiscreteScheduler;
namespace pipelines {
struct ResolvedRequest;
struct TaskCall;
struct TaskStart;
}  // namespace pipelines

class FluxPipeline : public DiffusionPipeline {
 public:
  // `model` is a diffusers folder or a repo id ("black-forest-labs/FLUX.1-dev") in the local HF cache.
  static FluxPipeline from_pretrained(const std::string& model, const PipelineLoadOptions& options = {});
  FluxPipeline(FluxPipeline&&) noexcept;
  FluxPipeline& operator=(FluxPipeline&&) noexcept;
  ~FluxPipeline() override;
  // diffusers' from_pipe: a FluxPipeline holding `pipe`'s components, nothing loaded again (the same weights,
  // LoRA adapters and compiled programs); its siblings' from_pipe go the other way. A call to either waits
  // for the other's; a setting changed afterwards on one (offload, tiling) is not seen by the other.
  static FluxPipeline from_pipe(const FluxPipeline& pipe);

  const char* class_name() const override { return "FluxPipeline"; }
  PipelineDefaults family_defaults() const override { return {}; }

  // ---- the stages, as diffusers names them (public so each can be checked against diffusers)
  struct PromptEmbeddings {
    Tensor prompt_embeds;                   // [B, L, joint_attention_dim] (T5)
    Tensor pooled_prompt_embeds;            // [B, pooled_projection_dim] (CLIP)
    Tensor text_ids;                        // [L, 3]
    std::vector<int64_t> clip_ids, t5_ids;  // the token ids of the (first) prompt
  };
  PromptEmbeddings encode_prompt(const std::string& prompt, const std::optional<std::string>& prompt_2,
                                 int num_images_per_prompt, int64_t max_sequence_length) const;
  // Several prompts as one batch (diffusers' prompt list): each prompt's embeddings n times, in order.
  PromptEmbeddings encode_prompts(const std::vector<std::string>& prompts,
                                  const std::optional<std::string>& prompt_2, int num_images_per_prompt,
                                  int64_t max_sequence_length) const;
  // Packed noise [B, N, in_channels] and its image ids [N, 3], drawn as diffusers' prepare_latents does.
  std::pair<Tensor, Tensor> prepare_latents(int64_t batch, int64_t height, int64_t width, DType dtype,
                                            Generator& generator) const;
  // With diffusers' generator list: image i's noise from generators[i] (one generator: the whole batch).
  std::pair<Tensor, Tensor> prepare_latents(int64_t batch, int64_t height, int64_t width, DType dtype,
                                            const std::vector<Generator*>& generators) const;
  // Packed latents -> float image [B, H, W, 3] in [0, 1] (diffusers' output_type="np").
  Tensor decode_latents(const Tensor& latents, int64_t height, int64_t width) const;
  // _encode_vae_image: a preprocessed image [1, 3, H, W] (float32 in [-1, 1]) through the VAE, its posterior
  // sampled with `generator`, shifted and scaled: [1, C, H / 8, W / 8] in `dtype`.
  Tensor encode_image(const Tensor& image, DType dtype, Generator& generator) const;

  const models::FluxTransformer2DModel& transformer() const { return *transformer_; }
  // For compiled mode: pipe.transformer().compile({...}) or .compile_repeated_blocks().
  models::FluxTransformer2DModel& transformer() { return *transformer_; }
  std::vector<std::pair<std::string, nn::Module*>> components() const override;
  nn::Module& denoiser() override;
  ActivationEstimate estimate_activations(const PipelineRequest& request,
                                          const Device& device) const override;

 protected:
  FluxPipeline(const FluxPipeline& pipe, SharingComponents);
  FluxPipeline();
  // Loads `model` (whose model_index.json names `pipeline_class` or one of `compatible`) into `pipe`.
  static void load(FluxPipeline& pipe, const std::string& model, const PipelineLoadOptions& options,
                   const char* pipeline_class, std::initializer_list<const char*> compatible);
  void check_loaded_request(const PipelineRequest& request) const override;
  bool negative_evaluations(const PipelineRequest& request) const override;

  // ---- what the editing classes add to the shared stages (pipelines/task_stages.h)
  // The call's size: the request's (or the defaults); Kontext's keeps its aspect ratio at max_area.
  virtual void resize_call(const PipelineRequest& request, pipelines::ResolvedRequest& call) const;
  // What the transformer reads beside the latents: Fill's channels beside each token (the masked image's
  // latents and the mask), Kontext's tokens after the latents' (the image's) with their position ids.
  struct DenoiserInputs {
    Tensor condition;             // [B, N, C'] concatenated to each token's channels
    Tensor context, context_ids;  // [B, M, 4C] after the latents' tokens, [M, 3]
  };
  virtual DenoiserInputs denoiser_inputs(const pipelines::TaskCall& call,
                                         const pipelines::TaskStart& start) const;
  // [B, C, h, w] -> [B, (h/2)(w/2), 4C] (diffusers' _pack_latents).
  static Tensor pack(const Tensor& latents);
  const models::AutoencoderKL& vae() const { return *vae_; }

 private:
  models::LatentCodec& latent_codec() const override;
  PipelineOutput run(const PipelineRequest& request, const pipelines::CallControl& control) override;
  // The call's prompt embeddings (its prompts encoded, or the embeddings it gives) and, with true
  // classifier-free guidance (true_cfg_scale > 1 and a negative prompt), the negative prompt's.
  struct CallPrompts {
    PromptEmbeddings positive;
    std::optional<PromptEmbeddings> negative;
    float true_cfg_scale = 1.0f;
  };
  CallPrompts call_prompts(const PipelineRequest& request, int64_t max_sequence_length) const;

  std::shared_ptr<tokenizers::ClipTokenizer> tokenizer_;
  std::shared_ptr<tokenizers::T5Tokenizer> tokenizer_2_;
  std::shared_ptr<models::ClipTextModel> text_encoder_;
  std::shared_ptr<models::T5EncoderModel> text_encoder_2_;
  std::shared_ptr<models::FluxTransformer2DModel> transformer_;
  std::shared_ptr<models::AutoencoderKL> vae_;
  std::shared_ptr<FlowMatchEulerDiscreteScheduler> scheduler_;
};

// FluxImg2ImgPipeline: FLUX.1 image-to-image. `image` (one) is resized to the call's size, encoded by the
// VAE, noised to the schedule's step int(n - n * strength) and denoised from there. Loads FluxPipeline
// folders too. Defaults (diffusers'): 1024 x 1024 (not the image's size), 28 steps, guidance 7.0, strength
// 0.6.
class FluxImg2ImgPipeline : public FluxPipeline {
 public:
  static FluxImg2ImgPipeline from_pretrained(const std::string& model,
                                             const PipelineLoadOptions& options = {});
  // diffusers' from_pipe: the FluxPipeline's components (its siblings' too), nothing loaded again.
  static FluxImg2ImgPipeline from_pipe(const FluxPipeline& pipe);
  const char* class_name() const override { return "FluxImg2ImgPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  FluxImg2ImgPipeline() = default;
  FluxImg2ImgPipeline(const FluxPipeline& pipe, SharingComponents)
      : FluxPipeline(pipe, SharingComponents{}) {}
};

// FluxInpaintPipeline: FLUX.1 inpainting. As image-to-image, and after every step the region outside
// `mask_image` (white: repaint, black: keep; binarised at half) is put back from the image, noised to the
// next step's level; with `padding_mask_crop` only the region around the mask is repainted (at the call's
// size) and pasted back into the image. Defaults as FluxImg2ImgPipeline.
class FluxInpaintPipeline : public FluxPipeline {
 public:
  static FluxInpaintPipeline from_pretrained(const std::string& model,
                                             const PipelineLoadOptions& options = {});
  // diffusers' from_pipe: the FluxPipeline's components (its siblings' too), nothing loaded again.
  static FluxInpaintPipeline from_pipe(const FluxPipeline& pipe);
  const char* class_name() const override { return "FluxInpaintPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  FluxInpaintPipeline() = default;
  FluxInpaintPipeline(const FluxPipeline& pipe, SharingComponents)
      : FluxPipeline(pipe, SharingComponents{}) {}
};

// FluxFillPipeline: FLUX.1 Fill [dev], whose transformer takes the masked image's latents and the mask (8 x 8
// pixels per latent, packed) beside the latents. Defaults: 1024 x 1024, 50 steps, guidance 30, strength 1.
class FluxFillPipeline : public FluxPipeline {
 public:
  static FluxFillPipeline from_pretrained(const std::string& model, const PipelineLoadOptions& options = {});
  const char* class_name() const override { return "FluxFillPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  FluxFillPipeline() = default;
  // The masked image (black where the mask repaints) encoded (the generator's third draw), and the mask's 8 x
  // 8 pixels per latent as channels, each packed, beside each token.
  DenoiserInputs denoiser_inputs(const pipelines::TaskCall& call,
                                 const pipelines::TaskStart& start) const override;
};

// FluxKontextPipeline: FLUX.1 Kontext [dev], editing by instruction. The image (optional) is encoded (its
// latent mean) and its tokens appended to the sequence with their own position ids (first coordinate 1); the
// output keeps the aspect ratio of height x width at max_area pixels (default 1024 x 1024), and the image is
// first resized to the trained resolution nearest its aspect ratio (auto_resize). Loads FluxPipeline folders
// too. Defaults: 28 steps, guidance 3.5.
class FluxKontextPipeline : public FluxPipeline {
 public:
  static FluxKontextPipeline from_pretrained(const std::string& model,
                                             const PipelineLoadOptions& options = {});
  const char* class_name() const override { return "FluxKontextPipeline"; }
  // The call's output size: height x width (or the default) rescaled to max_area pixels, in multiples of 16.
  std::pair<int64_t, int64_t> output_size(const PipelineRequest& request) const;
  // The image's size after the auto-resize (the trained resolution nearest its aspect ratio), multiples
  // of 16.
  static std::pair<int64_t, int64_t> image_size(const Image& image, bool auto_resize);

 private:
  FluxKontextPipeline() = default;
  void check_loaded_request(const PipelineRequest& request) const override;
  void resize_call(const PipelineRequest& request, pipelines::ResolvedRequest& call) const override;
  // The image at the trained resolution nearest its aspect ratio, encoded (its latent mean: no draw), packed,
  // its ids those of its own grid with the first coordinate 1.
  DenoiserInputs denoiser_inputs(const pipelines::TaskCall& call,
                                 const pipelines::TaskStart& start) const override;
};

}  // namespace kiln
