// Stable Diffusion 3 / 3.5 (Stability AI): text-to-image with skip-layer guidance, image-to-image and
// inpainting, as diffusers' StableDiffusion3Pipeline and its siblings.
#include "families/family_helpers.h"
#include "kiln/families/sd3/sd3_pipeline.h"
#include "kiln/models/sd3_transformer.h"

namespace kiln::sd3 {

namespace {

std::unique_ptr<nn::Module> unloaded_component(const std::string& class_name, const std::string& folder) {
  using namespace models;
  if (class_name == "SD3Transformer2DModel")
    return std::make_unique<SD3Transformer2DModel>(SD3TransformerConfig::from_file(folder));
  return shared_unloaded_component(class_name, folder);
}

}  // namespace

Family family() {
  // CLIP-L reads prompt, CLIP-G prompt_2, T5 prompt_3 (each prompt when absent).
  const std::vector<std::string> prompts = {"prompt",
                                            "prompt_2",
                                            "prompt_3",
                                            "prompts",
                                            "prompt_embeds",
                                            "pooled_prompt_embeds",
                                            "negative_prompt",
                                            "negative_prompt_2",
                                            "negative_prompt_3",
                                            "negative_prompts",
                                            "negative_prompt_embeds",
                                            "negative_pooled_prompt_embeds"};
  const std::vector<std::string> splittable = {"transformer", "text_encoder_3"};
  // diffusers' SD3 editing pipelines encode image[i] with generator[i] for every image of the batch, which
  // their one input image does not have: they take one generator (for prompt lists too), and no skip-layer
  // guidance.
  const std::vector<std::string> editing =
      joined_fields({common_request_fields(), prompts, {"image", "strength"}});
  Family descriptor;
  descriptor.name = "SD3";
  descriptor.classes = {
      {.name = "StableDiffusion3Pipeline",
       .task = Task::TextToImage,
       .fields = joined_fields({common_request_fields(),
                                {"generators"},
                                prompts,
                                {"skip_guidance_layers", "skip_layer_guidance_scale",
                                 "skip_layer_guidance_start", "skip_layer_guidance_stop"}}),
       .splittable_components = splittable,
       .load = load_pipeline<StableDiffusion3Pipeline>,
       .from_pipe = pipe_from<StableDiffusion3Pipeline, StableDiffusion3Pipeline>},
      {.name = "StableDiffusion3Img2ImgPipeline",
       .task = Task::ImageToImage,
       .fields = editing,
       .splittable_components = splittable,
       .loads_folders_of = {"StableDiffusion3Pipeline", "StableDiffusion3InpaintPipeline"},
       .load = load_pipeline<StableDiffusion3Img2ImgPipeline>,
       .from_pipe = pipe_from<StableDiffusion3Img2ImgPipeline, StableDiffusion3Pipeline>},
      {.name = "StableDiffusion3InpaintPipeline",
       .task = Task::Inpainting,
       .fields = joined_fields({editing, {"mask_image", "padding_mask_crop"}}),
       .splittable_components = splittable,
       .loads_folders_of = {"StableDiffusion3Pipeline", "StableDiffusion3Img2ImgPipeline"},
       .load = load_pipeline<StableDiffusion3InpaintPipeline>,
       .from_pipe = pipe_from<StableDiffusion3InpaintPipeline, StableDiffusion3Pipeline>},
  };
  // diffusers' SD3LoraLoaderMixin: the diffusers layout alone, into the transformer and both CLIP encoders.
  descriptor.lora = lora::LoraFamily{.name = "SD3",
                                     .components = {"transformer", "text_encoder", "text_encoder_2"},
                                     .fuse_components = {"transformer", "text_encoder", "text_encoder_2"}};
  descriptor.unloaded_component = unloaded_component;
  return descriptor;
}

}  // namespace kiln::sd3
