#include "kiln/families/stable_diffusion/unet_pipeline.h"

#include "families/stable_diffusion/sd_components.h"
#include "families/stable_diffusion/sd_kohya_lora.h"
#include "families/stable_diffusion/sd_single_file.h"
#include "families/stable_diffusion/unet_activations.h"
#include "families/stable_diffusion/unet_guidance.h"
#include "families/stable_diffusion/unet_samplers.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/ops.h"
#include "kiln/pipelines/activation_estimate.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "pipelines/call_control.h"
#include "pipelines/call_generators.h"
#include "pipelines/pipeline_common.h"
#include "pipelines/task_stages.h"

namespace kiln {

UNetPipeline::UNetPipeline() = default;
UNetPipeline::UNetPipeline(UNetPipeline&&) noexcept = default;
UNetPipeline& UNetPipeline::operator=(UNetPipeline&&) noexcept = default;
UNetPipeline::~UNetPipeline() = default;
UNetPipeline::UNetPipeline(const UNetPipeline& pipe, SharingComponents)
    : DiffusionPipeline(pipe, SharingComponents{}),
      unet_(pipe.unet_),
      vae_(pipe.vae_),
      samplers_(pipe.samplers_) {}

void UNetPipeline::begin_loading(pipelines::PipelineFolder& folder, const std::string& model,
                                 const PipelineLoadOptions& options, const char* pipeline_class,
                                 const char* kind) {
  // What the family declares splittable (the UNet), resolved before any weights load: a request to split
  // anything else is refused here.
  unet_parallel_ =
      options.tensor_parallel_for("unet", find_pipeline_class(pipeline_class)->splittable_components);
  path_ = folder.path();
  name_ = options.single_file.empty() ? model : options.single_file;  // what the images name
  dtype_ = options.dtype;
  make_context(options, model);
  // A finetune's single file: its components, the folder's configs (and components the file lacks).
  if (!options.single_file.empty()) {
    single_file_ = std::make_shared<models::StableDiffusionSingleFile>(
        models::open_stable_diffusion_single_file(options.single_file));
    const models::StableDiffusionSingleFile::Kind found_kind = single_file_->kind;
    const std::string found = models::kind_name(found_kind);
    // SDXL base and refiner files share the classes; the config folder says which one it describes
    // (requires_aesthetics_score), and a file on the other's configs would mix their components and time ids.
    const bool file_refiner = found_kind == models::StableDiffusionSingleFile::Kind::SDXLRefiner;
    const bool folder_refiner = std::string(kind) == "SDXL refiner";
    const bool xl_file = found_kind == models::StableDiffusionSingleFile::Kind::SDXL || file_refiner;
    KILN_CHECK(file_refiner == folder_refiner || !xl_file || std::string(kind) == "SD1.x",
               options.single_file << ": an SDXL " << (file_refiner ? "refiner" : "base")
                                   << " checkpoint, but " << model
                                   << ", whose configs it was given, is an SDXL "
                                   << (folder_refiner ? "refiner" : "base")
                                   << " (model_index.json: requires_aesthetics_score "
                                   << (folder_refiner ? "true" : "false") << "): give the "
                                   << (file_refiner ? "refiner" : "base") << "'s configs (--config "
                                   << models::default_config(found_kind) << " or a folder of it)");
    // StableDiffusionPipeline and its siblings run SD1.x and SD2.x alike (their folder's configs differ).
    const bool sd2_as_sd = std::string(kind) == "SD1.x" && found == "SD2.x";
    KILN_CHECK(found == kind || sd2_as_sd, options.single_file << ": an " << found << " checkpoint, which "
                                                               << models::single_file_class(found_kind, false)
                                                               << " runs, not " << pipeline_class);
  }
  samplers_ = std::make_shared<UNetSamplers>(
      folder.need("scheduler", {"EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler",
                                "DPMSolverMultistepScheduler", "DDIMScheduler", "PNDMScheduler"}));
  folder.loaded("scheduler");
}

const nn::WeightSource* UNetPipeline::single_file_component(const std::string& component) const {
  if (!single_file_) return nullptr;
  return component == "text_encoder_2" ? single_file_->text_encoder_2.get()
                                       : single_file_->text_encoder.get();
}

void UNetPipeline::finish_loading_unet(pipelines::PipelineFolder& folder,
                                       const PipelineLoadOptions& options) {
  unet_ = models::load_unet(folder.need("unet", {"UNet2DConditionModel"}), options.dtype, single_file_.get(),
                            unet_parallel_);
  folder.loaded("unet");
  vae_ = models::load_autoencoder_kl(folder.need("vae", {"AutoencoderKL"}), options.dtype,
                                     single_file_ ? single_file_->vae.get() : nullptr);
  folder.loaded("vae");
  single_file_.reset();
  finish_loading(options.packed_weight_budget);
  // The latents' channels, or an inpainting UNet's (diffusers' num_channels_unet == 9): the latents, the mask
  // and the masked image's latents.
  const int64_t in = unet_->config().in_channels, latent = vae_->config().latent_channels;
  KILN_CHECK(in == latent || in == 2 * latent + 1,
             path_ << ": unet in_channels " << in << " is neither the vae's latent_channels " << latent
                   << " nor an inpainting UNet's " << 2 * latent + 1
                   << " (the latents, the mask and the masked image's latents)");
  KILN_CHECK(unet_->config().out_channels == latent, path_ << ": unet out_channels "
                                                           << unet_->config().out_channels
                                                           << " is not the vae's latent_channels " << latent);
}

bool UNetPipeline::inpainting_unet() const {
  return unet_->config().in_channels != vae_->config().latent_channels;
}

int64_t UNetPipeline::default_image_size() const {
  return unet_->config().sample_size * vae_->config().scale_factor();
}

pipelines::ResolvedRequest UNetPipeline::resolved(const PipelineRequest& request) const {
  return pipelines::resolve_with_image_size(request, defaults(), registered_class().edits_an_image(),
                                            vae_->config().scale_factor());
}

void UNetPipeline::check_unet_request(const PipelineRequest& request) const {
  const char* name = class_name();
  const pipelines::ResolvedRequest r = resolved(request);
  pipelines::check_image_size(name, r.height, r.width, vae_->config().scale_factor());
  // An inpainting UNet has nothing to read in its mask and masked-image channels without a mask: diffusers'
  // text-to-image and image-to-image pipelines fail on it (its first convolution gets 4 channels of 9).
  if (inpainting_unet() && registered_class().task != Task::Inpainting)
    throw RequestError("mask_image",
                       std::string(name) + ": the UNet takes " + std::to_string(unet_->config().in_channels) +
                           " input channels (an inpainting UNet: the latents, the mask and the "
                           "masked image's latents), which only inpainting gives it: run it as " +
                           (unet_->config().text_time() ? "StableDiffusionXLInpaintPipeline"
                                                        : "StableDiffusionInpaintPipeline") +
                           " with an image and a mask_image");
  // denoising_start replaces strength (diffusers ignores it then), so strength need leave no step.
  pipelines::ResolvedRequest tasked = r;
  if (request.denoising_start) tasked.strength = 1.0;
  pipelines::check_task_inputs(registered_class().task, name, request, tasked, /*whole_strength_steps=*/true);
  samplers_->check(request);
  check_hand_off(request);
}

void UNetPipeline::check_hand_off(const PipelineRequest& request) const {
  const std::string name = class_name();
  const pipelines::ResolvedRequest r = resolved(request);
  const Tensor& given = request.image_latents;
  // diffusers' 9-channel inpainting reads the masked image's latents, which latents given as the image do not
  // have, and with denoising_start never computes the image's own (both fail there).
  if (inpainting_unet() && (given.defined() || request.denoising_start))
    throw RequestError(
        given.defined() ? "image_latents" : "denoising_start",
        name + ": " + (given.defined() ? "image_latents" : "denoising_start") +
            " with an inpainting UNet (9 input channels: it reads the masked image's latents, "
            "which a hand-off does not have; diffusers fails on it): refine with a UNet of the "
            "latents' own channels (the SDXL refiner)");
  if (given.defined() && given.dim() == 4) {
    const int64_t channels = vae_->config().latent_channels, factor = vae_->config().scale_factor();
    const int64_t batch = pipelines::batch_size(request);
    const auto& shape = given.shape();
    if (shape[1] != channels || (shape[0] != 1 && shape[0] != batch))
      throw RequestError("image_latents", name + ": image_latents must be [1 or " + std::to_string(batch) +
                                              " (the images of the call), " + std::to_string(channels) +
                                              " (the VAE's latent channels), height / " +
                                              std::to_string(factor) + ", width / " + std::to_string(factor) +
                                              "], got " + given.str());
    if (r.height != shape[2] * factor || r.width != shape[3] * factor)
      throw RequestError(request.height && r.height != shape[2] * factor ? "height" : "width",
                         name + ": height x width " + std::to_string(r.height) + "x" +
                             std::to_string(r.width) + " is not the size of the image_latents " +
                             given.str() + " (" + std::to_string(shape[2] * factor) + "x" +
                             std::to_string(shape[3] * factor) + "): leave height and width out");
    pipelines::refuse(request.padding_mask_crop.has_value(), "padding_mask_crop",
                      name + ": padding_mask_crop crops an image, and image_latents are no image");
  }
  if (request.denoising_start && request.denoising_end && *request.denoising_start >= *request.denoising_end)
    throw RequestError("denoising_start",
                       name + ": denoising_start " + std::to_string(*request.denoising_start) +
                           " must be below denoising_end " + std::to_string(*request.denoising_end));
  if (request.denoising_start || request.denoising_end)
    hand_off_steps(request, *samplers_->for_call(request, r.num_inference_steps));
}

UNetPipeline::HandOffSteps UNetPipeline::hand_off_steps(const PipelineRequest& request,
                                                        const DiscreteScheduler& sampler) const {
  HandOffSteps steps;
  const int n = static_cast<int>(sampler.timesteps().size());
  const auto none_left = [&](const char* field, double value) {
    throw RequestError(field, std::string(class_name()) + ": " + field + " " + std::to_string(value) +
                                  " leaves no step of the " + std::to_string(n) + " timesteps (" +
                                  std::to_string(static_cast<int64_t>(sampler.timesteps().front())) + " to " +
                                  std::to_string(static_cast<int64_t>(sampler.timesteps().back())) +
                                  "): give more num_inference_steps or another fraction");
  };
  if (request.denoising_start) {
    steps.start = UNetSamplers::denoising_start_step(sampler, *request.denoising_start);
    if (*steps.start >= n) none_left("denoising_start", *request.denoising_start);
  }
  if (request.denoising_end) {
    steps.end = UNetSamplers::denoising_end_step(sampler, *request.denoising_end, steps.start.value_or(0));
    if (*steps.end == steps.start.value_or(0)) none_left("denoising_end", *request.denoising_end);
  }
  return steps;
}

PipelineOutput UNetPipeline::run_unet(const PipelineRequest& request, const pipelines::CallControl& control,
                                      const UNetConditioning& conditioning) {
  const pipelines::ResolvedRequest call = resolved(request);
  pipelines::CallGenerators generators(request);
  const std::unique_ptr<DiscreteScheduler> schedule = samplers_->for_call(request, call.num_inference_steps);
  const HandOffSteps hand_off = hand_off_steps(request, *schedule);
  // The latents in the prompt's dtype (diffusers' prepare_latents); at strength 1, inpainting starts from the
  // noise itself, as diffusers' SD and SDXL inpainting do, and a strength runs int(n * strength) steps (their
  // get_timesteps). A 9-channel UNet is handed the mask and the masked image's latents instead of a blend.
  const pipelines::TaskCall task{.task = registered_class().task,
                                 .pipeline = class_name(),
                                 .request = request,
                                 .call = call,
                                 .batch = pipelines::batch_size(request),
                                 .dtype = dtype_,
                                 .generators = generators,
                                 .schedule = *schedule,
                                 .codec = *vae_,
                                 .noise_at_full_strength = true,
                                 .masked_image_channels = inpainting_unet(),
                                 .whole_strength_steps = true,
                                 .start_step = hand_off.start,
                                 .end_step = hand_off.end};
  const pipelines::TaskStart start = pipelines::start_latents(task);
  const models::UNetStep step{
      .unet = *unet_,
      .context = conditioning.context,
      .added = conditioning.added,
      .guided = conditioning.guided,
      .guidance_scale = call.guidance_scale,
      .guidance_rescale = request.guidance_rescale.value_or(0.0f),
      .inpainting_channels = start.mask_latents.defined()
                                 ? concat({start.mask_latents.to(start.masked_image_latents.device()),
                                           start.masked_image_latents},
                                          1)
                                 : Tensor()};
  return denoise_and_decode(
      task, start,
      [&](const Tensor& latents, int, float t) { return models::unet_noise_prediction(step, latents, t); },
      [&](const Tensor& latents) {
        // latents / scaling_factor, decoded in the pipeline's dtype (diffusers upcasts only float16 VAEs).
        return pipelines::postprocess(vae_->decode(vae_->from_latents(latents.to(dtype_))));
      },
      conditioning.guided, {{"scheduler", UNetSamplers::describe(*schedule)}}, control);
}

ActivationEstimate UNetPipeline::unet_activations(const PipelineRequest& request,
                                                  const Device& device) const {
  const pipelines::ResolvedRequest call = resolved(request);
  const int64_t factor = vae_->config().scale_factor();
  ActivationEstimate e{.height = call.height, .width = call.width};
  const int64_t images = pipelines::batch_size(request);
  e.transformer = unet_activation_bytes(unet_->config(), images * (call.guidance_scale > 1.0f ? 2 : 1),
                                        call.height / factor, call.width / factor, dtype());
  e.vae = vae_activation_bytes(*vae_, images, call.height, call.width, dtype(), device);
  return e;
}

models::LatentCodec& UNetPipeline::latent_codec() const {
  return *vae_;
}

lora::LoraFamily UNetPipeline::lora_family(const lora::LoraFamily& registered) const {
  const models::UNet2DConditionConfig& c = unet_->config();
  lora::LoraFamily family = models::stable_diffusion_lora_family(
      static_cast<int64_t>(c.block_out_channels.size()), c.layers_per_block.front());
  family.name = registered.name;
  return family;
}

nn::Module& UNetPipeline::denoiser() {
  return *unet_;
}

}  // namespace kiln
