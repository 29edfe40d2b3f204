// The UNet family: Stable Diffusion 1.x/2.x (StableDiffusionPipeline and its image-to-image and inpainting
// siblings) and SDXL (StableDiffusionXLPipeline and its siblings), as diffusers runs them. One denoiser,
// UNet2DConditionModel; CLIP text encoders; AutoencoderKL; the samplers of kiln/schedulers.
#include <algorithm>

#include "families/family_helpers.h"
#include "families/stable_diffusion/sd_kohya_lora.h"
#include "families/stable_diffusion/sd_single_file.h"
#include "kiln/families/stable_diffusion/stable_diffusion_pipeline.h"
#include "kiln/families/stable_diffusion/stable_diffusion_xl_pipeline.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/nn/weight_file.h"

namespace kiln::stable_diffusion {

namespace {

std::unique_ptr<nn::Module> unloaded_component(const std::string& class_name, const std::string& folder) {
  if (class_name == "UNet2DConditionModel")
    return std::make_unique<models::UNet2DConditionModel>(models::UNet2DConditionConfig::from_file(folder));
  return shared_unloaded_component(class_name, folder);
}

// A finetune as one file in Stability's layout (model.diffusion_model.input_blocks, cond_stage_model,
// conditioner.embedders, first_stage_model): SD1.x on SD1.5's configs, SDXL on SDXL base's, the SDXL refiner
// on the refiner's (as StableDiffusionXLImg2ImgPipeline, its folder's class), as diffusers' from_single_file
// picks them; an inpainting UNet (9 input channels) as the inpainting class, on the same configs (load_unet
// takes in_channels from the file); SD2.x on SD 2.1's (2-inpainting's for a 9-channel UNet).
std::optional<SingleFilePipeline> single_file(const std::string& path) {
  const std::shared_ptr<const nn::WeightSource> file = nn::open_weight_file(path);
  bool stability = false;
  for (const std::string& name : file->names())
    for (const char* prefix : {"model.diffusion_model.input_blocks.", "cond_stage_model.",
                               "conditioner.embedders.", "first_stage_model."})
      stability = stability || name.rfind(prefix, 0) == 0;
  // A UNet alone without the prefix (ComfyUI-GGUF's SD1.x / SDXL files).
  stability = stability || (file->contains("input_blocks.0.0.weight") && file->contains("out.2.weight"));
  if (!stability) return std::nullopt;
  const models::StableDiffusionSingleFile sd = models::read_stable_diffusion_single_file(file);
  return SingleFilePipeline{models::single_file_class(sd.kind, sd.in_channels == 9),
                            models::default_config(sd.kind, sd.in_channels == 9)};
}

// The fields every class of the family takes: the common ones but CLIP's fixed 77 tokens, prompts as text,
// the sampler, clip_skip and guidance_rescale.
std::vector<std::string> text_to_image_fields(const std::vector<std::string>& prompts) {
  std::vector<std::string> common = common_request_fields();
  common.erase(std::remove(common.begin(), common.end(), "max_sequence_length"), common.end());
  return joined_fields(
      {common, {"generators"}, prompts, {"scheduler", "use_karras_sigmas", "clip_skip", "guidance_rescale"}});
}

// Three classes over the same folders: text-to-image, image-to-image and inpainting.
// `editing`: the fields only the image-to-image and inpainting classes take (SDXL's aesthetic scores:
// diffusers' text-to-image class has no refiner conditioning).
template <class TextToImage, class ImageToImage, class Inpainting>
std::vector<PipelineClass> three_classes(const std::vector<std::string>& names,
                                         const std::vector<std::string>& text_to_image,
                                         const std::vector<std::string>& editing = {}) {
  // The UNet's transformer blocks split over tensor-parallel ranks (attention heads, feed-forward width);
  // CLIP, the VAE and the UNet's convolutions stay whole on every rank.
  const std::vector<std::string> splittable = {"unet"};
  const auto others = [&](const std::string& self) {
    std::vector<std::string> out;
    for (const std::string& s : names)
      if (s != self) out.push_back(s);
    return out;
  };
  return {
      {.name = names[0],
       .task = Task::TextToImage,
       .fields = text_to_image,
       .splittable_components = splittable,
       .loads_folders_of = others(names[0]),
       .load = load_pipeline<TextToImage>,
       .from_pipe = pipe_from<TextToImage, TextToImage>},
      {.name = names[1],
       .task = Task::ImageToImage,
       .fields = joined_fields({text_to_image, editing, {"image", "strength"}}),
       .splittable_components = splittable,
       .loads_folders_of = others(names[1]),
       .load = load_pipeline<ImageToImage>,
       .from_pipe = pipe_from<ImageToImage, TextToImage>},
      {.name = names[2],
       .task = Task::Inpainting,
       .fields =
           joined_fields({text_to_image, editing, {"image", "mask_image", "strength", "padding_mask_crop"}}),
       .splittable_components = splittable,
       .loads_folders_of = others(names[2]),
       .load = load_pipeline<Inpainting>,
       .from_pipe = pipe_from<Inpainting, TextToImage>},
  };
}

}  // namespace

Family family() {
  const std::vector<std::string> sd_prompts = {"prompt", "prompts", "negative_prompt", "negative_prompts"};
  const std::vector<std::string> sdxl_prompts = {"prompt",
                                                 "prompt_2",
                                                 "prompts",
                                                 "negative_prompt",
                                                 "negative_prompt_2",
                                                 "negative_prompts",
                                                 "original_size",
                                                 "target_size",
                                                 "crops_coords_top_left",
                                                 "negative_original_size",
                                                 "negative_target_size",
                                                 "negative_crops_coords_top_left"};
  Family descriptor;
  descriptor.name = "Stable Diffusion";
  descriptor.classes =
      three_classes<StableDiffusionPipeline, StableDiffusionImg2ImgPipeline, StableDiffusionInpaintPipeline>(
          {"StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline", "StableDiffusionInpaintPipeline"},
          text_to_image_fields(sd_prompts));
  const std::vector<PipelineClass> xl = three_classes<
      StableDiffusionXLPipeline, StableDiffusionXLImg2ImgPipeline, StableDiffusionXLInpaintPipeline>(
      {"StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline", "StableDiffusionXLInpaintPipeline"},
      // denoising_end in every SDXL class; the refiner's end of the hand-off (denoising_start, latents as the
      // image) only where diffusers takes an image.
      joined_fields({text_to_image_fields(sdxl_prompts), {"denoising_end"}}),
      {"aesthetic_score", "negative_aesthetic_score", "denoising_start", "image_latents"});
  descriptor.classes.insert(descriptor.classes.end(), xl.begin(), xl.end());
  // diffusers' StableDiffusion(XL)LoraLoaderMixin in its own (PEFT) layout and kohya's: the UNet's and the
  // text encoders' Linear layers, SD1.x's 1x1 proj_in / proj_out and (LoCon) the UNet's convolutions. SD1.5's
  // and SDXL's UNets have 2 ResNets a level (SDXL 3 levels, SD1.5 4: 4 reads both);
  // a loaded pipeline takes its UNet's own (UNetPipeline::lora_family).
  descriptor.lora = models::stable_diffusion_lora_family(4, 2);
  descriptor.unloaded_component = unloaded_component;
  descriptor.single_file = single_file;
  return descriptor;
}

}  // namespace kiln::stable_diffusion
