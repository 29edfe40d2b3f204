// Qwen-Image (Qwen/Qwen-Image): text-to-image, image-to-image and inpainting, as diffusers'
// QwenImagePipeline, QwenImageImg2ImgPipeline and QwenImageInpaintPipeline; editing (one image, several) as
// QwenImageEditPipeline and QwenImageEditPlusPipeline. A 60-block dual-stream MMDiT over
// the image's 2 x 2 patches and Qwen2.5-VL's text features, a causal 3-D VAE over a single frame.
#include "families/family_helpers.h"
#include "kiln/families/qwen_image/autoencoder_kl_qwen_image.h"
#include "kiln/families/qwen_image/qwen_image_edit_pipeline.h"
#include "kiln/families/qwen_image/qwen_image_edit_plus_pipeline.h"
#include "kiln/families/qwen_image/qwen_image_pipeline.h"
#include "kiln/families/qwen_image/qwen_image_transformer.h"

namespace kiln::qwen_image {

namespace {

// The transformer's modules as the non-diffusers LoRA layouts name them. Qwen-Image's original names are
// diffusers' own, so the table is the identity: it lets diffusers'
// _convert_non_diffusers_qwen_lora_to_diffusers layouts through, kohya's flattened names
// (lora_unet_transformer_blocks_0_attn_to_q, lora_unet_norm_out_linear), the diffusion_model.-prefixed ones
// (ai-toolkit, ComfyUI-side trainers) and lightx2v's bare ones (Qwen-Image-Lightning:
// transformer_blocks.0.attn.to_q.lora_down.weight), each pair scaled by its own alpha / rank.
lora::OriginalLayout original_layout() {
  lora::OriginalLayout layout;
  std::vector<lora::OriginalModule>& block = layout.block("transformer_blocks", "transformer_blocks");
  for (const char* module :
       {"img_mod.1", "txt_mod.1", "attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
        "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out", "img_mlp.net.0.proj", "img_mlp.net.2",
        "txt_mlp.net.0.proj", "txt_mlp.net.2"})
    block.push_back({module, {module}});
  for (const char* module :
       {"img_in", "txt_in", "proj_out", "norm_out.linear", "time_text_embed.timestep_embedder.linear_1",
        "time_text_embed.timestep_embedder.linear_2"})
    layout.top_level.push_back({module, {module}});
  return layout;
}

std::unique_ptr<nn::Module> unloaded_component(const std::string& class_name, const std::string& folder) {
  if (class_name == "QwenImageTransformer2DModel")
    return std::make_unique<models::QwenImageTransformer2DModel>(
        models::QwenImageTransformerConfig::from_file(folder));
  if (class_name == "AutoencoderKLQwenImage")
    return std::make_unique<models::AutoencoderKLQwenImage>(
        models::AutoencoderKLQwenImageConfig::from_file(folder + "/config.json"));
  if (class_name == "Qwen2_5_VLForConditionalGeneration") {
    const auto config = models::DecoderTextEncoderConfig::from_file(folder + "/config.json");
    return std::make_unique<models::DecoderTextEncoder>(config, config.num_hidden_layers, true);
  }
  return shared_unloaded_component(class_name, folder);
}

}  // namespace

Family family() {
  // Prompts as text (diffusers' prompt_embeds come with a mask, which the request does not carry); true
  // classifier-free guidance.
  const std::vector<std::string> prompts = {"prompt", "prompts", "negative_prompt", "negative_prompts",
                                            "true_cfg_scale"};
  const std::vector<std::string> splittable = {"transformer", "text_encoder"};
  const std::vector<std::string> text_to_image =
      joined_fields({common_request_fields(), {"generators", "cache"}, prompts});
  const std::vector<std::string> siblings = {"QwenImagePipeline", "QwenImageImg2ImgPipeline",
                                             "QwenImageInpaintPipeline"};
  const auto others = [&](const std::string& self) {
    std::vector<std::string> out;
    for (const std::string& s : siblings)
      if (s != self) out.push_back(s);
    return out;
  };
  Family descriptor;
  descriptor.name = "Qwen-Image";
  descriptor.classes = {
      {.name = "QwenImagePipeline",
       .task = Task::TextToImage,
       .fields = text_to_image,
       .splittable_components = splittable,
       .loads_folders_of = others("QwenImagePipeline"),
       .load = load_pipeline<QwenImagePipeline>,
       .from_pipe = pipe_from<QwenImagePipeline, QwenImagePipeline>},
      {.name = "QwenImageImg2ImgPipeline",
       .task = Task::ImageToImage,
       .fields = joined_fields({text_to_image, {"image", "strength"}}),
       .splittable_components = splittable,
       .loads_folders_of = others("QwenImageImg2ImgPipeline"),
       .load = load_pipeline<QwenImageImg2ImgPipeline>,
       .from_pipe = pipe_from<QwenImageImg2ImgPipeline, QwenImagePipeline>},
      {.name = "QwenImageInpaintPipeline",
       .task = Task::Inpainting,
       .fields = joined_fields({text_to_image, {"image", "mask_image", "strength", "padding_mask_crop"}}),
       .splittable_components = splittable,
       .loads_folders_of = others("QwenImageInpaintPipeline"),
       .load = load_pipeline<QwenImageInpaintPipeline>,
       .from_pipe = pipe_from<QwenImageInpaintPipeline, QwenImagePipeline>},
      // Its own checkpoint (Qwen-Image-Edit: another transformer, the processor); the image as context.
      {.name = "QwenImageEditPipeline",
       .task = Task::ImageEditing,
       .fields = joined_fields({text_to_image, {"image"}}),
       .splittable_components = splittable,
       .min_images = 1,
       .load = load_pipeline<QwenImageEditPipeline>},
      // Qwen-Image-Edit-2509's: several images, each read by Qwen2.5-VL and beside the noise.
      {.name = "QwenImageEditPlusPipeline",
       .task = Task::ImageEditing,
       .fields = joined_fields({text_to_image, {"image"}}),
       .splittable_components = splittable,
       .max_images = 0,  // diffusers sets no limit
       .min_images = 1,
       .load = load_pipeline<QwenImageEditPlusPipeline>},
  };
  // diffusers' QwenImageLoraLoaderMixin: the transformer only.
  descriptor.lora = lora::LoraFamily{
      .name = "Qwen-Image",
      .components = {"transformer"},
      .fuse_components = {"transformer"},
      .formats = {lora::LoraFormat::Diffusers, lora::LoraFormat::Kohya, lora::LoraFormat::BlackForestLabs},
      .original = original_layout()};
  descriptor.unloaded_component = unloaded_component;
  // Qwen2.5-VL read to hidden_states[-1]: every layer and the final norm; not its vision tower.
  descriptor.partial_weights = [](const io::ComponentSummary& component) {
    return decoder_text_encoder_weights(component, [](const models::DecoderTextEncoderConfig& config) {
      return std::vector<int64_t>{config.num_hidden_layers};
    });
  };
  return descriptor;
}

}  // namespace kiln::qwen_image
