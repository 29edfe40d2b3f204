// ZImagePipeline: Tongyi-MAI's Z-Image (Z-Image-Turbo, Z-Image) text-to-image, as diffusers' ZImagePipeline,
// from a diffusers folder or a Hugging Face repo id in the local cache:
//
//   auto pipe = kiln::ZImagePipeline::from_pretrained("Tongyi-MAI/Z-Image-Turbo", {.dtype = kiln::bfloat16});
//   auto result = pipe({.prompt = "a lighthouse at dawn", .num_inference_steps = 9, .guidance_scale = 0.0f,
//                       .generator = kiln::Generator(0)});
//   result.images[0].save("output.png");
//
// Each prompt goes through Qwen3's chat template (enable_thinking=True) and Qwen3; the second-to-last hidden
// states at the prompt's own tokens are its caption features (one length per prompt). The single-stream DiT
// (kiln/families/z_image/z_image_transformer.h) denoises FLUX.1's 16-channel latents, kept in float32 between
// steps, on the schedule sigmas = linspace(1, 1/n, n) shifted by the scheduler's config; FLUX.1's
// AutoencoderKL decodes. Classifier-free guidance when guidance_scale > 0: pos + g * (pos - neg), with
// cfg_normalization and cfg_truncation. Defaults: diffusers' (1024 x 1024, 50 steps, guidance 5, 512 tokens);
// Z-Image-Turbo is run with 9 steps and guidance 0.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/pipelines/diffusion_pipeline.h"

namespace kiln {

namespace models {
class DecoderTextEncoder;
class ZImageTransformer2DModel;
class AutoencoderKL;
}  // namespace models
namespace tokenizers {
class BpeTokenizer;
}  // namespace tokenizers
class FlowMatchEulerDiscreteScheduler;

class ZImagePipeline : public DiffusionPipeline {
 public:
  static ZImagePipeline from_pretrained(const std::string& model, const PipelineLoadOptions& options = {});
  ZImagePipeline(ZImagePipeline&&) noexcept;
  ZImagePipeline& operator=(ZImagePipeline&&) noexcept;
  ~ZImagePipeline() override;
  // diffusers' from_pipe: a ZImagePipeline holding `pipe`'s components, nothing loaded again (the same
  // weights, LoRA adapters and compiled programs); its siblings' from_pipe go the other way. A call to either
  // waits for the other's; a setting changed afterwards on one (offload, tiling) is not seen by the other.
  static ZImagePipeline from_pipe(const ZImagePipeline& pipe);

  const char* class_name() const override { return "ZImagePipeline"; }
  PipelineDefaults family_defaults() const override;

  // ---- the stages, as diffusers names them
  // The chat-templated prompt the tokenizer reads.
  static std::string chat_prompt(const std::string& prompt);
  // input_ids and attention_mask [B, max_sequence_length] int64 as the pipeline tokenizes the prompts.
  std::pair<Tensor, Tensor> tokenize(const std::vector<std::string>& prompts,
                                     int64_t max_sequence_length) const;
  // Each prompt's caption features [L_i, hidden] (the text encoder's hidden_states[-2] at its tokens), in the
  // text encoder's dtype; one per prompt (num_images_per_prompt repeats are the caller's).
  std::vector<Tensor> encode_prompt(const std::vector<std::string>& prompts,
                                    int64_t max_sequence_length) const;

  const models::ZImageTransformer2DModel& transformer() const { return *transformer_; }
  models::ZImageTransformer2DModel& transformer() { return *transformer_; }
  std::vector<std::pair<std::string, nn::Module*>> components() const override;
  nn::Module& denoiser() override;
  ActivationEstimate estimate_activations(const PipelineRequest& request,
                                          const Device& device) const override;

 protected:
  ZImagePipeline(const ZImagePipeline& pipe, SharingComponents);
  ZImagePipeline();
  static void load(ZImagePipeline& pipe, const std::string& model, const PipelineLoadOptions& options,
                   const char* pipeline_class);
  void check_loaded_request(const PipelineRequest& request) const override;

 private:
  models::LatentCodec& latent_codec() const override;
  PipelineOutput run(const PipelineRequest& request, const pipelines::CallControl& control) override;

  std::shared_ptr<tokenizers::BpeTokenizer> tokenizer_;
  std::shared_ptr<models::DecoderTextEncoder> text_encoder_;
  std::shared_ptr<models::ZImageTransformer2DModel> transformer_;
  std::shared_ptr<models::AutoencoderKL> vae_;
  std::shared_ptr<FlowMatchEulerDiscreteScheduler> scheduler_;
};

// ZImageImg2ImgPipeline: Z-Image image-to-image. `image` (one) is encoded by the VAE (its posterior sampled:
// the generator's first draw), noised to the schedule's step int(n - n * strength) and denoised from there.
// Without height and width, the image's own size (each rounded down to a multiple of 16), as diffusers. Loads
// ZImagePipeline folders too. Defaults: those of ZImagePipeline, strength 0.6.
class ZImageImg2ImgPipeline : public ZImagePipeline {
 public:
  static ZImageImg2ImgPipeline from_pretrained(const std::string& model,
                                               const PipelineLoadOptions& options = {});
  // diffusers' from_pipe: the ZImagePipeline's components (its siblings' too), nothing loaded again.
  static ZImageImg2ImgPipeline from_pipe(const ZImagePipeline& pipe);
  const char* class_name() const override { return "ZImageImg2ImgPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  ZImageImg2ImgPipeline() = default;
  ZImageImg2ImgPipeline(const ZImagePipeline& pipe, SharingComponents)
      : ZImagePipeline(pipe, SharingComponents{}) {}
};

// ZImageInpaintPipeline: Z-Image inpainting: `image` and `mask_image` (white repaints, black keeps;
// binarised), the kept region put back from the image noised to each next step. Defaults: strength 1.
class ZImageInpaintPipeline : public ZImagePipeline {
 public:
  static ZImageInpaintPipeline from_pretrained(const std::string& model,
                                               const PipelineLoadOptions& options = {});
  // diffusers' from_pipe: the ZImagePipeline's components (its siblings' too), nothing loaded again.
  static ZImageInpaintPipeline from_pipe(const ZImagePipeline& pipe);
  const char* class_name() const override { return "ZImageInpaintPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  ZImageInpaintPipeline() = default;
  ZImageInpaintPipeline(const ZImagePipeline& pipe, SharingComponents)
      : ZImagePipeline(pipe, SharingComponents{}) {}
};

}  // namespace kiln
