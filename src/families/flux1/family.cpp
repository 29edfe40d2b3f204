// FLUX.1 (Black Forest Labs): FLUX.1-schnell / -dev text-to-image, image-to-image, inpainting, Fill and
// Kontext, as diffusers' FluxPipeline and its siblings.
#include "families/family_helpers.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/models/flux_single_file.h"
#include "kiln/models/flux_transformer.h"

namespace kiln::flux1 {

namespace {

// Black Forest Labs' module names of the FLUX.1 transformer and the diffusers layers each one is (diffusers'
// _convert_kohya_flux_lora_to_diffusers and _convert_non_diffusers_flux_lora_to_diffusers).
lora::OriginalLayout original_layout() {
  lora::OriginalLayout layout = models::flux_backbone_lora_layout();
  layout.block(lora::kDoubleBlocks, "transformer_blocks").push_back({"img_mod.lin", {"norm1.linear"}});
  layout.block(lora::kDoubleBlocks, "transformer_blocks")
      .push_back({"txt_mod.lin", {"norm1_context.linear"}});
  layout.block(lora::kSingleBlocks, "single_transformer_blocks")
      .push_back({"modulation.lin", {"norm.linear"}});
  const std::vector<lora::OriginalModule> embeddings = {
      {"time_in.in_layer", {"time_text_embed.timestep_embedder.linear_1"}},
      {"time_in.out_layer", {"time_text_embed.timestep_embedder.linear_2"}},
      {"vector_in.in_layer", {"time_text_embed.text_embedder.linear_1"}},
      {"vector_in.out_layer", {"time_text_embed.text_embedder.linear_2"}},
      {"guidance_in.in_layer", {"time_text_embed.guidance_embedder.linear_1"}},
      {"guidance_in.out_layer", {"time_text_embed.guidance_embedder.linear_2"}},
      {"final_layer.adaLN_modulation.1", {"norm_out.linear"}, true},
  };
  layout.top_level.insert(layout.top_level.end(), embeddings.begin(), embeddings.end());
  return layout;
}

std::unique_ptr<nn::Module> unloaded_component(const std::string& class_name, const std::string& folder) {
  using namespace models;
  if (class_name == "FluxTransformer2DModel")
    return std::make_unique<FluxTransformer2DModel>(FluxTransformerConfig::from_file(folder));
  return shared_unloaded_component(class_name, folder);
}

}  // namespace

Family family() {
  const std::vector<std::string> prompts = {"prompt", "prompt_2", "prompts", "prompt_embeds",
                                            "pooled_prompt_embeds"};
  // True classifier-free guidance (true_cfg_scale with a negative prompt); diffusers' Fill has none.
  const std::vector<std::string> negatives = {"negative_prompt",
                                              "negative_prompt_2",
                                              "negative_prompts",
                                              "negative_prompt_embeds",
                                              "negative_pooled_prompt_embeds",
                                              "true_cfg_scale"};
  const std::vector<std::string> splittable = {"transformer", "text_encoder_2"};
  const std::vector<std::string> text_to_image =
      joined_fields({common_request_fields(), {"generators", "cache"}, prompts, negatives});
  Family descriptor;
  descriptor.name = "FLUX.1";
  descriptor.classes = {
      {.name = "FluxPipeline",
       .task = Task::TextToImage,
       .fields = text_to_image,
       .splittable_components = splittable,
       .load = load_pipeline<FluxPipeline>,
       .from_pipe = pipe_from<FluxPipeline, FluxPipeline>},
      {.name = "FluxImg2ImgPipeline",
       .task = Task::ImageToImage,
       .fields = joined_fields({text_to_image, {"image", "strength"}}),
       .splittable_components = splittable,
       .loads_folders_of = {"FluxPipeline", "FluxInpaintPipeline"},
       .load = load_pipeline<FluxImg2ImgPipeline>,
       .from_pipe = pipe_from<FluxImg2ImgPipeline, FluxPipeline>},
      {.name = "FluxInpaintPipeline",
       .task = Task::Inpainting,
       .fields = joined_fields({text_to_image, {"image", "mask_image", "strength", "padding_mask_crop"}}),
       .splittable_components = splittable,
       .loads_folders_of = {"FluxPipeline", "FluxImg2ImgPipeline"},
       .load = load_pipeline<FluxInpaintPipeline>,
       .from_pipe = pipe_from<FluxInpaintPipeline, FluxPipeline>},
      {.name = "FluxFillPipeline",
       .task = Task::Fill,
       .fields = joined_fields(
           {common_request_fields(), {"generators", "cache"}, prompts, {"image", "mask_image", "strength"}}),
       .splittable_components = splittable,
       .load = load_pipeline<FluxFillPipeline>},
      {.name = "FluxKontextPipeline",
       .task = Task::ImageEditing,
       .fields = joined_fields({text_to_image, {"image", "max_area", "auto_resize"}}),
       .splittable_components = splittable,
       .load = load_pipeline<FluxKontextPipeline>},
  };
  descriptor.lora = lora::LoraFamily{.name = "FLUX.1",
                                     .components = {"transformer", "text_encoder"},
                                     .fuse_components = {"transformer"},
                                     .formats = {lora::LoraFormat::Diffusers, lora::LoraFormat::Kohya,
                                                 lora::LoraFormat::BlackForestLabs, lora::LoraFormat::XLabs},
                                     .original = original_layout(),
                                     .clip_text_encoder = true,
                                     .pads_narrow_down = true};
  descriptor.unloaded_component = unloaded_component;
  return descriptor;
}

}  // namespace kiln::flux1
