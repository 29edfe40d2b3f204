// Chroma (lodestones: Chroma1-HD, -Base, -Flash): text-to-image and image-to-image, as diffusers' ChromaPipeline
// and ChromaImg2ImgPipeline. FLUX.1's blocks (models/flux_blocks.h) with an approximator for the modulation, T5
// alone, real classifier-free guidance.
#include "families/family_helpers.h"
#include "kiln/families/chroma/chroma_pipeline.h"
#include "kiln/families/chroma/chroma_transformer.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/t5_encoder.h"

namespace kiln::chroma {

namespace {

// The original names of Chroma's transformer modules (its checkpoint's layout, which kohya and ComfyUI LoRA files
// follow): FLUX.1's without the modulations, as diffusers' FLUX converter reads them for Chroma.
lora::OriginalLayout original_layout() {
  lora::OriginalLayout layout;
  layout.double_block = {
      {"img_attn.qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}},
      {"txt_attn.qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
      {"img_attn.proj", {"attn.to_out.0"}},
      {"txt_attn.proj", {"attn.to_add_out"}},
      {"img_mlp.0", {"ff.net.0.proj"}},
      {"img_mlp.2", {"ff.net.2"}},
      {"txt_mlp.0", {"ff_context.net.0.proj"}},
      {"txt_mlp.2", {"ff_context.net.2"}},
  };
  layout.single_block = {
      {"linear1", {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"}},
      {"linear2", {"proj_out"}},
  };
  layout.top_level = {
      {"img_in", {"x_embedder"}},
      {"txt_in", {"context_embedder"}},
      {"final_layer.linear", {"proj_out"}},
  };
  return layout;
}

std::unique_ptr<nn::Module> unloaded_component(const std::string& class_name, const std::string& folder) {
  using namespace models;
  if (class_name == "ChromaTransformer2DModel")
    return std::make_unique<ChromaTransformer2DModel>(ChromaTransformerConfig::from_file(folder));
  if (class_name == "AutoencoderKL")
    return std::make_unique<AutoencoderKL>(AutoencoderKLConfig::from_file(folder + "/config.json"));
  if (class_name == "T5EncoderModel")
    return std::make_unique<T5EncoderModel>(T5EncoderConfig::from_file(folder + "/config.json"));
  return nullptr;
}

}  // namespace

Family family() {
  // Prompts as text: diffusers pairs given embeddings with attention masks, which the request does not carry.
  const std::vector<std::string> prompts = {"prompt", "prompts", "negative_prompt", "negative_prompts"};
  const std::vector<std::string> splittable = {"transformer", "text_encoder"};
  const std::vector<std::string> text_to_image = joined_fields({common_request_fields(), {"generators"}, prompts});
  Family descriptor;
  descriptor.name = "Chroma";
  descriptor.classes = {
      {.name = "ChromaPipeline",
       .task = Task::TextToImage,
       .fields = text_to_image,
       .splittable_components = splittable,
       .loads_folders_of = {"ChromaImg2ImgPipeline"},
       .load = load_pipeline<ChromaPipeline>},
      {.name = "ChromaImg2ImgPipeline",
       .task = Task::ImageToImage,
       .fields = joined_fields({text_to_image, {"image", "strength"}}),
       .splittable_components = splittable,
       .loads_folders_of = {"ChromaPipeline"},
       .load = load_pipeline<ChromaImg2ImgPipeline>},
  };
  // diffusers' ChromaPipeline loads LoRA with FLUX.1's loader: its transformer and its T5 (text_encoder).
  descriptor.lora = lora::LoraFamily{.name = "Chroma",
                                     .components = {"transformer", "text_encoder"},
                                     .fuse_components = {"transformer"},
                                     .formats = {lora::LoraFormat::Diffusers, lora::LoraFormat::Kohya,
                                                 lora::LoraFormat::BlackForestLabs},
                                     .original = original_layout()};
  descriptor.unloaded_component = unloaded_component;
  return descriptor;
}

}  // namespace kiln::chroma
