// StableDiffusionPipeline: Stable Diffusion 1.x and 2.x (and their finetunes) text-to-image, as diffusers'
// StableDiffusionPipeline, from a diffusers folder or a Hugging Face repo id in the local cache:
//
//   auto pipe =
//   kiln::StableDiffusionPipeline::from_pretrained("stable-diffusion-v1-5/stable-diffusion-v1-5"); auto
//   result = pipe({.prompt = "a lighthouse at dawn", .generator = kiln::Generator(0)});
//   result.images[0].save("output.png");
//
// CLIP's last hidden states (through the final layer norm; clip_skip reads an earlier layer) condition a
// UNet2DConditionModel (kiln/families/stable_diffusion/unet_2d_condition.h) that predicts the noise of
// 4-channel latents; the folder's scheduler (PNDM for SD1.5; any of Kiln's samplers with `scheduler`) steps
// them; AutoencoderKL decodes latents / scaling_factor. Classifier-free guidance when guidance_scale > 1:
// uncond + g * (text - uncond), then guidance_rescale. The safety checker is not run (diffusers'
// safety_checker=None). Defaults: diffusers' (the UNet's sample_size * 8 pixels square: 512 for SD1.5, 50
// steps, guidance 7.5).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/families/stable_diffusion/unet_pipeline.h"

namespace kiln {

namespace models {
class ClipTextModel;
}  // namespace models
namespace tokenizers {
class ClipTokenizer;
}  // namespace tokenizers

class StableDiffusionPipeline : public UNetPipeline {
 public:
  static StableDiffusionPipeline from_pretrained(const std::string& model,
                                                 const PipelineLoadOptions& options = {});
  StableDiffusionPipeline(StableDiffusionPipeline&&) noexcept;
  StableDiffusionPipeline& operator=(StableDiffusionPipeline&&) noexcept;
  ~StableDiffusionPipeline() override;
  // diffusers' from_pipe: a StableDiffusionPipeline holding `pipe`'s components, nothing loaded again.
  static StableDiffusionPipeline from_pipe(const StableDiffusionPipeline& pipe);

  const char* class_name() const override { return "StableDiffusionPipeline"; }
  PipelineDefaults family_defaults() const override;

  // ---- the stages, as diffusers names them
  // input_ids [B, 77] int64, each prompt padded to the tokenizer's model_max_length (truncated).
  Tensor tokenize(const std::vector<std::string>& prompts) const;
  // encode_prompt: [B, 77, hidden] in the pipeline's dtype; clip_skip > 0 reads hidden_states[-(clip_skip
  // + 1)] through the final layer norm.
  Tensor encode_prompt(const std::vector<std::string>& prompts, int clip_skip = 0) const;

  std::vector<std::pair<std::string, nn::Module*>> components() const override;
  ActivationEstimate estimate_activations(const PipelineRequest& request,
                                          const Device& device) const override;

 protected:
  StableDiffusionPipeline(const StableDiffusionPipeline& pipe, SharingComponents);
  StableDiffusionPipeline();
  static void load(StableDiffusionPipeline& pipe, const std::string& model,
                   const PipelineLoadOptions& options, const char* pipeline_class);
  void check_loaded_request(const PipelineRequest& request) const override;

 private:
  PipelineOutput run(const PipelineRequest& request, const pipelines::CallControl& control) override;

  std::shared_ptr<tokenizers::ClipTokenizer> tokenizer_;
  std::shared_ptr<models::ClipTextModel> text_encoder_;
};

// StableDiffusionImg2ImgPipeline: image-to-image. `image` (one) is encoded by the VAE (its posterior sampled:
// the generator's first draw), noised to the schedule's step int(n - n * strength) and denoised from there.
// Without height and width, the image's own size (each rounded down to a multiple of 8). Loads
// StableDiffusionPipeline folders too. Defaults: strength 0.8.
class StableDiffusionImg2ImgPipeline : public StableDiffusionPipeline {
 public:
  static StableDiffusionImg2ImgPipeline from_pretrained(const std::string& model,
                                                        const PipelineLoadOptions& options = {});
  static StableDiffusionImg2ImgPipeline from_pipe(const StableDiffusionPipeline& pipe);
  const char* class_name() const override { return "StableDiffusionImg2ImgPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  StableDiffusionImg2ImgPipeline() = default;
  StableDiffusionImg2ImgPipeline(const StableDiffusionPipeline& pipe, SharingComponents)
      : StableDiffusionPipeline(pipe, SharingComponents{}) {}
};

// StableDiffusionInpaintPipeline with a 4-channel UNet (any text-to-image folder): `image` and `mask_image`
// (white repaints, black keeps; binarised), the kept region put back from the image noised to each next step.
// (The 9-channel inpainting UNets, sd-v1-5-inpainting, are not run yet.) Defaults: strength 1.
class StableDiffusionInpaintPipeline : public StableDiffusionPipeline {
 public:
  static StableDiffusionInpaintPipeline from_pretrained(const std::string& model,
                                                        const PipelineLoadOptions& options = {});
  static StableDiffusionInpaintPipeline from_pipe(const StableDiffusionPipeline& pipe);
  const char* class_name() const override { return "StableDiffusionInpaintPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  StableDiffusionInpaintPipeline() = default;
  StableDiffusionInpaintPipeline(const StableDiffusionPipeline& pipe, SharingComponents)
      : StableDiffusionPipeline(pipe, SharingComponents{}) {}
};

}  // namespace kiln
