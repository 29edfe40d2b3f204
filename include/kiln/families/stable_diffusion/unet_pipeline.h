// What the UNet family's pipelines (StableDiffusionPipeline, StableDiffusionXLPipeline and their siblings)
// share: the UNet, the VAE and the samplers; loading them from a folder or a finetune's single file; the
// request checks that need the loaded models; and the call after the prompt is encoded (the sampler set for
// the call, the task's starting latents, the guided UNet step, the decode). A pipeline class adds its text
// encoders and what it gives the UNet (the prompt's tokens, SDXL's added conditions).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/pipelines/diffusion_pipeline.h"

namespace kiln {

namespace models {
class AutoencoderKL;
struct StableDiffusionSingleFile;
}  // namespace models
namespace pipelines {
class PipelineFolder;
struct ResolvedRequest;
}  // namespace pipelines
class UNetSamplers;
class DiscreteScheduler;

class UNetPipeline : public DiffusionPipeline {
 public:
  UNetPipeline(UNetPipeline&&) noexcept;
  UNetPipeline& operator=(UNetPipeline&&) noexcept;
  ~UNetPipeline() override;

  const models::UNet2DConditionModel& unet() const { return *unet_; }
  models::UNet2DConditionModel& unet() { return *unet_; }
  nn::Module& denoiser() override;

 protected:
  UNetPipeline();
  UNetPipeline(const UNetPipeline& pipe, SharingComponents);

  // What the UNet is given besides the latents, for a whole call: the prompt's tokens (the negative prompt's
  // first under guidance) and SDXL's added conditions over the same batch.
  struct UNetConditioning {
    Tensor context;
    models::UNetAddedConditions added;
    bool guided = false;
  };

  // ---- loading, in the order a pipeline calls them
  // Refuses tensor parallelism, sets the pipeline's name, dtype and context, opens options.single_file (which
  // must be a `kind` file: "SD1.x", "SDXL" or "SDXL refiner", the folder's kind) and loads the scheduler.
  void begin_loading(pipelines::PipelineFolder& folder, const std::string& model,
                     const PipelineLoadOptions& options, const char* pipeline_class, const char* kind);
  // The single file's text encoder view `component` ("text_encoder", "text_encoder_2"), null without one.
  const nn::WeightSource* single_file_component(const std::string& component) const;
  // Loads the UNet and the VAE (the single file's where it has them) and finishes loading.
  void finish_loading_unet(pipelines::PipelineFolder& folder, const PipelineLoadOptions& options);

  // ---- calls
  // The call's size, steps and guidance: the image's own size for the editing classes without one.
  pipelines::ResolvedRequest resolved(const PipelineRequest& request) const;
  // The checks every class makes once loaded: the size a multiple of the VAE's factor, the task's inputs, the
  // sampler the request names.
  void check_unet_request(const PipelineRequest& request) const;
  // The call once the prompt is encoded: starting latents by task, the denoising loop with `conditioning`,
  // the decode; the image's metadata names the sampler.
  PipelineOutput run_unet(const PipelineRequest& request, const pipelines::CallControl& control,
                          const UNetConditioning& conditioning);
  // The UNet's and the VAE's activations for `request` (the text encoders' are the class's).
  ActivationEstimate unet_activations(const PipelineRequest& request, const Device& device) const;
  // The UNet's sample_size in pixels: diffusers' default height and width.
  int64_t default_image_size() const;
  // Whether the UNet is an inpainting one (diffusers' num_channels_unet == 9): it reads the mask and the
  // masked image's latents beside the latents, and runs only as the inpainting class.
  bool inpainting_unet() const;
  // SDXL's hand-off (denoising_start / denoising_end) on the call's sampler: the first step and the step the
  // loop stops before, each unset without its field. RequestError naming the field when it leaves no step.
  struct HandOffSteps {
    std::optional<int> start, end;
  };
  HandOffSteps hand_off_steps(const PipelineRequest& request, const DiscreteScheduler& sampler) const;
  // Latents given as the image (image_latents) and denoising_start, against this UNet and VAE and the call.
  void check_hand_off(const PipelineRequest& request) const;

  std::shared_ptr<models::UNet2DConditionModel> unet_;
  std::shared_ptr<models::AutoencoderKL> vae_;
  std::shared_ptr<UNetSamplers> samplers_;

 private:
  models::LatentCodec& latent_codec() const override;
  // The family's LoRA descriptor for this UNet's levels and layers_per_block (kohya's SGM names).
  lora::LoraFamily lora_family(const lora::LoraFamily& registered) const override;

  // Open while loading from a single file; released once loading ends.
  std::shared_ptr<models::StableDiffusionSingleFile> single_file_;
  // The UNet's share on this rank (the whole UNet without tensor parallelism), set by begin_loading.
  nn::TensorParallel unet_parallel_;
};

}  // namespace kiln
