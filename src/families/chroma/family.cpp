// Chroma (lodestones: Chroma1-HD, -Base, -Flash): text-to-image and image-to-image, as diffusers'
// ChromaPipeline and ChromaImg2ImgPipeline. FLUX.1's blocks (models/flux_blocks.h) with an approximator for
// the modulation, T5 alone, real classifier-free guidance.
#include "families/family_helpers.h"
#include "kiln/families/chroma/chroma_pipeline.h"
#include "kiln/families/chroma/chroma_transformer.h"
#include "kiln/models/flux_single_file.h"

namespace kiln::chroma {

namespace {

std::unique_ptr<nn::Module> unloaded_component(const std::string& class_name, const std::string& folder) {
  using namespace models;
  if (class_name == "ChromaTransformer2DModel")
    return std::make_unique<ChromaTransformer2DModel>(ChromaTransformerConfig::from_file(folder));
  return shared_unloaded_component(class_name, folder);
}

}  // namespace

Family family() {
  // Prompts as text: diffusers pairs given embeddings with attention masks, which the request does not carry.
  const std::vector<std::string> prompts = {"prompt", "prompts", "negative_prompt", "negative_prompts"};
  const std::vector<std::string> splittable = {"transformer", "text_encoder"};
  // Step caches (`cache`): TaylorSeer, Pyramid Attention Broadcast and FasterCache (these two without
  // classifier-free guidance); First Block Cache and MagCache are refused by name (diffusers 0.42.1 runs
  // neither on Chroma: models::chroma_block_cache_refusal).
  const std::vector<std::string> text_to_image =
      joined_fields({common_request_fields(), {"generators", "cache"}, prompts});
  Family descriptor;
  descriptor.name = "Chroma";
  descriptor.classes = {
      {.name = "ChromaPipeline",
       .task = Task::TextToImage,
       .fields = text_to_image,
       .splittable_components = splittable,
       .loads_folders_of = {"ChromaImg2ImgPipeline"},
       .load = load_pipeline<ChromaPipeline>,
       .from_pipe = pipe_from<ChromaPipeline, ChromaPipeline>},
      {.name = "ChromaImg2ImgPipeline",
       .task = Task::ImageToImage,
       .fields = joined_fields({text_to_image, {"image", "strength"}}),
       .splittable_components = splittable,
       .loads_folders_of = {"ChromaPipeline"},
       .load = load_pipeline<ChromaImg2ImgPipeline>,
       .from_pipe = pipe_from<ChromaImg2ImgPipeline, ChromaPipeline>},
  };
  // diffusers' ChromaPipeline loads LoRA with FLUX.1's loader: its transformer and its T5 (text_encoder);
  // files in the original layout name FLUX.1's backbone (Chroma has none of FLUX.1's modulation layers).
  descriptor.lora = lora::LoraFamily{
      .name = "Chroma",
      .components = {"transformer", "text_encoder"},
      .fuse_components = {"transformer"},
      .formats = {lora::LoraFormat::Diffusers, lora::LoraFormat::Kohya, lora::LoraFormat::BlackForestLabs},
      .original = models::flux_backbone_lora_layout()};
  descriptor.unloaded_component = unloaded_component;
  return descriptor;
}

}  // namespace kiln::chroma
