// FLUX.2 (Black Forest Labs): FLUX.2-dev and FLUX.2 [klein], text-to-image conditioned on reference images,
// as diffusers' Flux2Pipeline and Flux2KleinPipeline.
#include <algorithm>

#include "families/family_helpers.h"
#include "kiln/core/shape.h"
#include "kiln/families/flux2/flux2_pipeline.h"
#include "kiln/models/autoencoder_kl_flux2.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux2_prompt_encoder.h"
#include "kiln/models/flux2_transformer.h"

namespace kiln::flux2 {

namespace {

// Black Forest Labs' module names of the FLUX.2 transformer (diffusers'
// _convert_non_diffusers_flux2_lora_to_diffusers and _convert_kohya_flux2_lora_to_diffusers): the blocks have
// no modulation of their own (it is shared), a SwiGLU feed-forward, and the single blocks keep linear1 fused.
lora::OriginalLayout original_layout() {
  lora::OriginalLayout layout;
  layout.block(lora::kDoubleBlocks, "transformer_blocks") = {
      {"img_attn.qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}},
      {"txt_attn.qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
      {"img_attn.proj", {"attn.to_out.0"}},
      {"txt_attn.proj", {"attn.to_add_out"}},
      {"img_mlp.0", {"ff.linear_in"}},
      {"img_mlp.2", {"ff.linear_out"}},
      {"txt_mlp.0", {"ff_context.linear_in"}},
      {"txt_mlp.2", {"ff_context.linear_out"}},
  };
  layout.block(lora::kSingleBlocks, "single_transformer_blocks") = {
      {"linear1", {"attn.to_qkv_mlp_proj"}},
      {"linear2", {"attn.to_out"}},
  };
  layout.top_level = {
      {"img_in", {"x_embedder"}},
      {"txt_in", {"context_embedder"}},
      {"time_in.in_layer", {"time_guidance_embed.timestep_embedder.linear_1"}},
      {"time_in.out_layer", {"time_guidance_embed.timestep_embedder.linear_2"}},
      {"guidance_in.in_layer", {"time_guidance_embed.guidance_embedder.linear_1"}},
      {"guidance_in.out_layer", {"time_guidance_embed.guidance_embedder.linear_2"}},
      {"final_layer.linear", {"proj_out"}},
      {"final_layer.adaLN_modulation.1", {"norm_out.linear"}, true},
      {"double_stream_modulation_img.lin", {"double_stream_modulation_img.linear"}},
      {"double_stream_modulation_txt.lin", {"double_stream_modulation_txt.linear"}},
      {"single_stream_modulation.lin", {"single_stream_modulation.linear"}},
  };
  return layout;
}

std::unique_ptr<nn::Module> unloaded_component(const std::string& class_name, const std::string& folder) {
  using namespace models;
  if (class_name == "Flux2Transformer2DModel")
    return std::make_unique<Flux2Transformer2DModel>(Flux2TransformerConfig::from_file(folder));
  if (class_name == "AutoencoderKLFlux2")
    return std::make_unique<AutoencoderKLFlux2>(AutoencoderKLConfig::from_file(folder + "/config.json"));
  return shared_unloaded_component(class_name, folder);
}

// The text encoder's weights the pipelines read: the embedding and the layers up to the deepest hidden state
// of the default text_encoder_out_layers (FLUX.2-dev: 30 of Mistral Small 3.x's 40 layers, without its vision
// tower and lm_head; klein: 27 of Qwen3's 36, without lm_head).
std::optional<LoadedWeights> partial_weights(const io::ComponentSummary& component) {
  return decoder_text_encoder_weights(component, [](const models::DecoderTextEncoderConfig& config) {
    return Flux2PromptEncoder::default_layers(config.family);
  });
}

}  // namespace

Family family() {
  // One text encoder, reference images (`image`); klein's classifier-free guidance takes a negative prompt,
  // FLUX.2-dev's embedded guidance none. Step caches (`cache`): MagCache with the ratios of a calibration
  // (none are published for FLUX.2) and TaylorSeer; First Block Cache is refused by name (diffusers 0.42.1
  // has no working one on FLUX.2: models::flux2_first_block_cache_refusal).
  const std::vector<std::string> dev = joined_fields(
      {common_request_fields(), {"generators", "prompt", "prompts", "prompt_embeds", "image", "cache"}});
  const std::vector<std::string> splittable = {"transformer", "text_encoder"};
  Family descriptor;
  descriptor.name = "FLUX.2";
  descriptor.classes = {
      {.name = "Flux2Pipeline",
       .task = Task::TextToImage,
       .fields = dev,
       .splittable_components = splittable,
       .load = load_pipeline<Flux2Pipeline>},
      {.name = "Flux2KleinPipeline",
       .task = Task::TextToImage,
       .fields = joined_fields({dev, {"negative_prompt", "negative_prompts", "negative_prompt_embeds"}}),
       .splittable_components = splittable,
       .load = load_pipeline<Flux2KleinPipeline>},
  };
  descriptor.lora = lora::LoraFamily{
      .name = "FLUX.2",
      .components = {"transformer"},
      .fuse_components = {"transformer"},
      .formats = {lora::LoraFormat::Diffusers, lora::LoraFormat::Kohya, lora::LoraFormat::BlackForestLabs},
      .original = original_layout()};
  descriptor.unloaded_component = unloaded_component;
  descriptor.partial_weights = partial_weights;
  return descriptor;
}

}  // namespace kiln::flux2
