// StableDiffusion3Pipeline: Stable Diffusion 3 / 3.5 (Medium, Large, Large Turbo) text-to-image, as
// diffusers' StableDiffusion3Pipeline, from a diffusers folder or a Hugging Face repo id in the local cache:
//
//   auto pipe = kiln::StableDiffusion3Pipeline::from_pretrained("stabilityai/stable-diffusion-3.5-medium",
//                                                               {.dtype = kiln::bfloat16});
//   auto result = pipe({.prompt = "a capybara reading a book", .negative_prompt = "blurry",
//                       .num_inference_steps = 40, .guidance_scale = 4.5f, .generator = kiln::Generator(0)});
//   result.images[0].save("output.png");
//
// It takes prompt, prompt_2 (CLIP-G's), prompt_3 (T5's), the negative prompts, the size, steps, guidance,
// generator, max_sequence_length, num_images_per_prompt and skip_layer_guidance of a PipelineRequest;
// defaults: the transformer's sample size (1024 for SD3.5), 28 steps, guidance 7.0, 256 T5 tokens.
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

#include "kiln/families/flux1/flux_pipeline.h"  // FlowMatchEulerDiscreteScheduler, tokenizers, encoders
#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/pipelines/generator.h"
#include "kiln/pipelines/image.h"
#include "kiln/pipelines/offload.h"

namespace kiln {

namespace models {
class SD3Transformer2DModel;
}  // namespace models

class StableDiffusion3Pipeline : public DiffusionPipeline {
 public:
  // `model` is a diffusers folder or a repo id ("stabilityai/stable-diffusion-3.5-large") in the local HF
  // cache. text_encoder_3 / tokenizer_3 may be absent ([null, null]): T5's embeddings are then zeros, as in
  // diffusers.
  static StableDiffusion3Pipeline from_pretrained(const std::string& model,
                                                  const PipelineLoadOptions& options = {});
  StableDiffusion3Pipeline(StableDiffusion3Pipeline&&) noexcept;
  StableDiffusion3Pipeline& operator=(StableDiffusion3Pipeline&&) noexcept;
  ~StableDiffusion3Pipeline() override;
  // diffusers' from_pipe: a StableDiffusion3Pipeline holding `pipe`'s components, nothing loaded again (the
  // same weights, LoRA adapters and compiled programs); its siblings' from_pipe go the other way. A call to
  // either waits for the other's; a setting changed afterwards on one (offload, tiling) is not seen by the
  // other.
  static StableDiffusion3Pipeline from_pipe(const StableDiffusion3Pipeline& pipe);

  const char* class_name() const override { return "StableDiffusion3Pipeline"; }
  PipelineDefaults family_defaults() const override;

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
  PromptEmbeddings encode_prompt(const PipelineRequest& request) const;
  // Noise [batch, in_channels, height / 8, width / 8], drawn as diffusers' prepare_latents does.
  Tensor prepare_latents(int64_t batch, int64_t height, int64_t width, DType dtype,
                         Generator& generator) const;
  Tensor prepare_latents(int64_t batch, int64_t height, int64_t width, DType dtype,
                         const std::vector<Generator*>& generators) const;  // one per image, or one
  // The velocity the scheduler steps with at denoising step `step` (timestep t): one transformer pass,
  // batched [negative; positive] and combined with the guidance scale when guidance is on, plus skip-layer
  // guidance when the call asks for it at this step.
  Tensor predict_velocity(const Tensor& latents, float timestep, int step, const PromptEmbeddings& prompt,
                          const PipelineRequest& request) const;
  // Latents -> float image [B, H, W, 3] in [0, 1] (diffusers' output_type="np").
  Tensor decode_latents(const Tensor& latents) const;

  const models::SD3Transformer2DModel& transformer() const { return *transformer_; }
  // For compiled mode: pipe.transformer().compile({...}) or .compile_repeated_blocks().
  models::SD3Transformer2DModel& transformer() { return *transformer_; }
  std::vector<std::pair<std::string, nn::Module*>> components() const override;
  nn::Module& denoiser() override;
  ActivationEstimate estimate_activations(const PipelineRequest& request,
                                          const Device& device) const override;
  // The image size a request without height and width gets.
  int64_t default_image_size() const;

 protected:
  StableDiffusion3Pipeline(const StableDiffusion3Pipeline& pipe, SharingComponents);
  StableDiffusion3Pipeline();
  static void load(StableDiffusion3Pipeline& pipe, const std::string& model,
                   const PipelineLoadOptions& options, const char* pipeline_class);
  void check_loaded_request(const PipelineRequest& request) const override;
  // The call's latents -> its images: decode_latents (StableDiffusion3InpaintPipeline's differs, as
  // diffusers').
  virtual Tensor decode_call(const Tensor& latents) const;
  const models::AutoencoderKL& vae() const { return *vae_; }

 private:
  models::LatentCodec& latent_codec() const override;
  PipelineOutput run(const PipelineRequest& request, const pipelines::CallControl& control) override;

  std::shared_ptr<tokenizers::ClipTokenizer> tokenizer_, tokenizer_2_;
  std::shared_ptr<tokenizers::T5Tokenizer> tokenizer_3_;  // null when the pipeline has no T5
  std::shared_ptr<models::ClipTextModel> text_encoder_, text_encoder_2_;
  std::shared_ptr<models::T5EncoderModel> text_encoder_3_;
  std::shared_ptr<models::SD3Transformer2DModel> transformer_;
  std::shared_ptr<models::AutoencoderKL> vae_;
  std::shared_ptr<FlowMatchEulerDiscreteScheduler> scheduler_;
};

// StableDiffusion3Img2ImgPipeline: SD3 / SD3.5 image-to-image (`image`, `strength`), as
// FluxImg2ImgPipeline does it. Loads StableDiffusion3Pipeline folders too. Defaults (diffusers'): the
// transformer's sample size, 50 steps, guidance 7.0, strength 0.6.
class StableDiffusion3Img2ImgPipeline : public StableDiffusion3Pipeline {
 public:
  static StableDiffusion3Img2ImgPipeline from_pretrained(const std::string& model,
                                                         const PipelineLoadOptions& options = {});
  // diffusers' from_pipe: the StableDiffusion3Pipeline's components (its siblings' too), nothing loaded
  // again.
  static StableDiffusion3Img2ImgPipeline from_pipe(const StableDiffusion3Pipeline& pipe);
  const char* class_name() const override { return "StableDiffusion3Img2ImgPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  StableDiffusion3Img2ImgPipeline() = default;
  StableDiffusion3Img2ImgPipeline(const StableDiffusion3Pipeline& pipe, SharingComponents)
      : StableDiffusion3Pipeline(pipe, SharingComponents{}) {}
};

// StableDiffusion3InpaintPipeline: SD3 / SD3.5 inpainting (`image`, `mask_image`, `strength`; a strength of 1
// starts from pure noise; `padding_mask_crop` as FluxInpaintPipeline). Defaults as
// StableDiffusion3Img2ImgPipeline.
class StableDiffusion3InpaintPipeline : public StableDiffusion3Pipeline {
 public:
  static StableDiffusion3InpaintPipeline from_pretrained(const std::string& model,
                                                         const PipelineLoadOptions& options = {});
  // diffusers' from_pipe: the StableDiffusion3Pipeline's components (its siblings' too), nothing loaded
  // again.
  static StableDiffusion3InpaintPipeline from_pipe(const StableDiffusion3Pipeline& pipe);
  const char* class_name() const override { return "StableDiffusion3InpaintPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  StableDiffusion3InpaintPipeline() = default;
  StableDiffusion3InpaintPipeline(const StableDiffusion3Pipeline& pipe, SharingComponents)
      : StableDiffusion3Pipeline(pipe, SharingComponents{}) {}
  // diffusers' StableDiffusion3InpaintPipeline decodes latents / scaling_factor without adding the shift the
  // other SD3 pipelines add back; its images are matched, so is that.
  Tensor decode_call(const Tensor& latents) const override;
};

}  // namespace kiln
