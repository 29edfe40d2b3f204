// Z-Image (Tongyi-MAI: Z-Image-Turbo, Z-Image): text-to-image, image-to-image and inpainting, as diffusers'
// ZImagePipeline, ZImageImg2ImgPipeline and ZImageInpaintPipeline. A single-stream DiT over the image's
// patches and Qwen3's caption features, FLUX.1's VAE.
#include "families/family_helpers.h"
#include "kiln/families/z_image/z_image_pipeline.h"
#include "kiln/families/z_image/z_image_transformer.h"

namespace kiln::z_image {

namespace {

// The transformer's modules under their original names (ComfyUI's single file, and the LoRAs trained on it:
// kohya's lora_unet_layers_0_attention_qkv, diffusion_model.layers.0.attention.out) beside diffusers' own,
// which LoRA trainers write too: diffusers' _convert_non_diffusers_z_image_lora_to_diffusers. A fused qkv
// feeds to_q, to_k and to_v (each the whole down, a third of up).
lora::OriginalLayout original_layout() {
  const std::vector<lora::OriginalModule> attention = {
      {"attention.qkv", {"attention.to_q", "attention.to_k", "attention.to_v"}},
      {"attention.out", {"attention.to_out.0"}},
      {"attention.to_q", {"attention.to_q"}},
      {"attention.to_k", {"attention.to_k"}},
      {"attention.to_v", {"attention.to_v"}},
      {"attention.to_out.0", {"attention.to_out.0"}},
      {"feed_forward.w1", {"feed_forward.w1"}},
      {"feed_forward.w2", {"feed_forward.w2"}},
      {"feed_forward.w3", {"feed_forward.w3"}},
  };
  std::vector<lora::OriginalModule> modulated = attention;
  modulated.push_back({"adaLN_modulation.0", {"adaLN_modulation.0"}});
  lora::OriginalLayout layout;
  layout.block("layers", "layers") = modulated;
  layout.block("noise_refiner", "noise_refiner") = modulated;
  layout.block("context_refiner", "context_refiner") = attention;
  // The released patch size (2, 1): its embedder and final layer.
  layout.top_level = {
      {"x_embedder", {"all_x_embedder.2-1"}},
      {"all_x_embedder.2-1", {"all_x_embedder.2-1"}},
      {"final_layer.linear", {"all_final_layer.2-1.linear"}},
      {"final_layer.adaLN_modulation.1", {"all_final_layer.2-1.adaLN_modulation.1"}},
      {"all_final_layer.2-1.linear", {"all_final_layer.2-1.linear"}},
      {"all_final_layer.2-1.adaLN_modulation.1", {"all_final_layer.2-1.adaLN_modulation.1"}},
      {"cap_embedder.1", {"cap_embedder.1"}},
      {"t_embedder.mlp.0", {"t_embedder.mlp.0"}},
      {"t_embedder.mlp.2", {"t_embedder.mlp.2"}},
  };
  return layout;
}

std::unique_ptr<nn::Module> unloaded_component(const std::string& class_name, const std::string& folder) {
  if (class_name == "ZImageTransformer2DModel")
    return std::make_unique<models::ZImageTransformer2DModel>(
        models::ZImageTransformerConfig::from_file(folder));
  return shared_unloaded_component(class_name, folder);
}

}  // namespace

Family family() {
  // Prompts as text (diffusers' prompt_embeds here are lists of per-prompt tensors, which the request does
  // not carry); Z-Image's own guidance options.
  const std::vector<std::string> prompts = {"prompt",           "prompts",           "negative_prompt",
                                            "negative_prompts", "cfg_normalization", "cfg_truncation"};
  const std::vector<std::string> splittable = {"transformer", "text_encoder"};
  const std::vector<std::string> text_to_image =
      joined_fields({common_request_fields(), {"generators"}, prompts});
  const std::vector<std::string> siblings = {"ZImagePipeline", "ZImageImg2ImgPipeline",
                                             "ZImageInpaintPipeline"};
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
       .load = load_pipeline<ZImagePipeline>,
       .from_pipe = pipe_from<ZImagePipeline, ZImagePipeline>},
      {.name = "ZImageImg2ImgPipeline",
       .task = Task::ImageToImage,
       .fields = joined_fields({text_to_image, {"image", "strength"}}),
       .splittable_components = splittable,
       .loads_folders_of = others("ZImageImg2ImgPipeline"),
       .load = load_pipeline<ZImageImg2ImgPipeline>,
       .from_pipe = pipe_from<ZImageImg2ImgPipeline, ZImagePipeline>},
      {.name = "ZImageInpaintPipeline",
       .task = Task::Inpainting,
       .fields = joined_fields({text_to_image, {"image", "mask_image", "strength"}}),
       .splittable_components = splittable,
       .loads_folders_of = others("ZImageInpaintPipeline"),
       .load = load_pipeline<ZImageInpaintPipeline>,
       .from_pipe = pipe_from<ZImageInpaintPipeline, ZImagePipeline>},
  };
  // diffusers' ZImageLoraLoaderMixin: the transformer only.
  descriptor.lora = lora::LoraFamily{
      .name = "Z-Image",
      .components = {"transformer"},
      .fuse_components = {"transformer"},
      .formats = {lora::LoraFormat::Diffusers, lora::LoraFormat::Kohya, lora::LoraFormat::BlackForestLabs},
      .original = original_layout()};
  descriptor.unloaded_component = unloaded_component;
  // Qwen3 read up to hidden_states[-2]: every layer but the last, no final norm.
  descriptor.partial_weights = [](const io::ComponentSummary& component) {
    return decoder_text_encoder_weights(component, [](const models::DecoderTextEncoderConfig& config) {
      return std::vector<int64_t>{config.num_hidden_layers - 1};
    });
  };
  return descriptor;
}

}  // namespace kiln::z_image
