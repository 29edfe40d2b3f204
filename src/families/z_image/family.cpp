// Z-Image (Tongyi-MAI: Z-Image-Turbo, Z-Image): text-to-image, image-to-image and inpainting, as diffusers'
// ZImagePipeline, ZImageImg2ImgPipeline and ZImageInpaintPipeline. A single-stream DiT over the image's patches and
// Qwen3's caption features, FLUX.1's VAE.
#include "families/family_helpers.h"
#include "kiln/families/z_image/z_image_pipeline.h"
#include "kiln/families/z_image/z_image_transformer.h"

namespace kiln::z_image {

namespace {

std::unique_ptr<nn::Module> unloaded_component(const std::string& class_name, const std::string& folder) {
  if (class_name == "ZImageTransformer2DModel")
    return std::make_unique<models::ZImageTransformer2DModel>(models::ZImageTransformerConfig::from_file(folder));
  return shared_unloaded_component(class_name, folder);
}

}  // namespace

Family family() {
  // Prompts as text (diffusers' prompt_embeds here are lists of per-prompt tensors, which the request does not
  // carry); Z-Image's own guidance options.
  const std::vector<std::string> prompts = {"prompt", "prompts", "negative_prompt", "negative_prompts",
                                            "cfg_normalization", "cfg_truncation"};
  const std::vector<std::string> splittable = {"transformer", "text_encoder"};
  const std::vector<std::string> text_to_image = joined_fields({common_request_fields(), {"generators"}, prompts});
  const std::vector<std::string> siblings = {"ZImagePipeline", "ZImageImg2ImgPipeline", "ZImageInpaintPipeline"};
  const auto others = [&](const std::string& self) {
    std::vector<std::string> out;
    for (const std::string& s : siblings)
      if (s != self) out.push_back(s);
    return out;
  };
  Family descriptor;
  descriptor.name = "Z-Image";
  descriptor.classes = {
      {.name = "ZImagePipeline",
       .task = Task::TextToImage,
       .fields = text_to_image,
       .splittable_components = splittable,
       .loads_folders_of = others("ZImagePipeline"),
       .load = load_pipeline<ZImagePipeline>},
      {.name = "ZImageImg2ImgPipeline",
       .task = Task::ImageToImage,
       .fields = joined_fields({text_to_image, {"image", "strength"}}),
       .splittable_components = splittable,
       .loads_folders_of = others("ZImageImg2ImgPipeline"),
       .load = load_pipeline<ZImageImg2ImgPipeline>},
      {.name = "ZImageInpaintPipeline",
       .task = Task::Inpainting,
       .fields = joined_fields({text_to_image, {"image", "mask_image", "strength"}}),
       .splittable_components = splittable,
       .loads_folders_of = others("ZImageInpaintPipeline"),
       .load = load_pipeline<ZImageInpaintPipeline>},
  };
  descriptor.unloaded_component = unloaded_component;
  return descriptor;
}

}  // namespace kiln::z_image
