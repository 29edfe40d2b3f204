#include "families/stable_diffusion/sd_kohya_lora.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "families/stable_diffusion/sd_single_file.h"

namespace kiln::models {

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// "<prefix><digits>_<rest>": the number (at most 6 digits) and the rest.
std::optional<std::pair<std::string, std::string>> numbered(const std::string& s, const std::string& prefix) {
  if (!starts_with(s, prefix)) return std::nullopt;
  size_t i = prefix.size(), digits = 0;
  while (i + digits < s.size() && s[i + digits] >= '0' && s[i + digits] <= '9') ++digits;
  if (digits == 0 || digits > 6 || i + digits + 1 >= s.size() || s[i + digits] != '_') return std::nullopt;
  return std::make_pair(s.substr(i, digits), s.substr(i + digits + 1));
}

std::optional<std::string> renamed(const std::string& flat,
                                   const std::vector<std::pair<const char*, const char*>>& table) {
  for (const auto& [from, to] : table)
    if (flat == from) return std::string(to);
  return std::nullopt;
}

// A Transformer2DModel's module: proj_in, proj_out, or a transformer block's attention or feed-forward
// Linear.
std::optional<std::string> attention_module(const std::string& flat) {
  if (flat == "proj_in" || flat == "proj_out") return flat;
  const auto block = numbered(flat, "transformer_blocks_");
  if (!block) return std::nullopt;
  const auto inner = renamed(block->second, {{"attn1_to_q", "attn1.to_q"},
                                             {"attn1_to_k", "attn1.to_k"},
                                             {"attn1_to_v", "attn1.to_v"},
                                             {"attn1_to_out_0", "attn1.to_out.0"},
                                             {"attn2_to_q", "attn2.to_q"},
                                             {"attn2_to_k", "attn2.to_k"},
                                             {"attn2_to_v", "attn2.to_v"},
                                             {"attn2_to_out_0", "attn2.to_out.0"},
                                             {"ff_net_0_proj", "ff.net.0.proj"},
                                             {"ff_net_2", "ff.net.2"}});
  if (!inner) return std::nullopt;
  return "transformer_blocks." + block->first + "." + *inner;
}

// diffusers' names, flattened (SD1.x files).
std::optional<std::string> diffusers_module(const std::string& flat) {
  if (auto top = renamed(flat, {{"conv_in", "conv_in"},
                                {"conv_out", "conv_out"},
                                {"time_embedding_linear_1", "time_embedding.linear_1"},
                                {"time_embedding_linear_2", "time_embedding.linear_2"},
                                {"add_embedding_linear_1", "add_embedding.linear_1"},
                                {"add_embedding_linear_2", "add_embedding.linear_2"}}))
    return top;
  std::string block, rest;
  if (const auto down = numbered(flat, "down_blocks_")) {
    block = "down_blocks." + down->first + ".";
    rest = down->second;
    if (rest == "downsamplers_0_conv") return block + "downsamplers.0.conv";
  } else if (const auto up = numbered(flat, "up_blocks_")) {
    block = "up_blocks." + up->first + ".";
    rest = up->second;
    if (rest == "upsamplers_0_conv") return block + "upsamplers.0.conv";
  } else if (starts_with(flat, "mid_block_")) {
    block = "mid_block.";
    rest = flat.substr(10);
  } else {
    return std::nullopt;
  }
  if (const auto a = numbered(rest, "attentions_"))
    if (const auto m = attention_module(a->second)) return block + "attentions." + a->first + "." + *m;
  if (const auto r = numbered(rest, "resnets_"))
    if (const auto m = renamed(r->second, {{"conv1", "conv1"},
                                           {"conv2", "conv2"},
                                           {"time_emb_proj", "time_emb_proj"},
                                           {"conv_shortcut", "conv_shortcut"}}))
      return block + "resnets." + r->first + "." + *m;
  return std::nullopt;
}

// A module of an SGM block's part: its ResNet (part 0), its attention, a sampler.
std::optional<std::string> sgm_part(const std::string& flat) {
  if (auto r = renamed(flat, {{"in_layers_2", "in_layers.2"},
                              {"out_layers_3", "out_layers.3"},
                              {"emb_layers_1", "emb_layers.1"},
                              {"skip_connection", "skip_connection"},
                              {"op", "op"},
                              {"conv", "conv"}}))
    return r;
  return attention_module(flat);
}

// SGM's names, flattened (SDXL files), dotted.
std::optional<std::string> sgm_dotted(const std::string& flat) {
  if (auto top = renamed(flat, {{"time_embed_0", "time_embed.0"},
                                {"time_embed_2", "time_embed.2"},
                                {"label_emb_0_0", "label_emb.0.0"},
                                {"label_emb_0_2", "label_emb.0.2"},
                                {"input_blocks_0_0", "input_blocks.0.0"},
                                {"out_2", "out.2"}}))
    return top;
  if (const auto middle = numbered(flat, "middle_block_")) {
    if (const auto m = sgm_part(middle->second)) return "middle_block." + middle->first + "." + *m;
    return std::nullopt;
  }
  for (const char* blocks : {"input_blocks", "output_blocks"}) {
    const auto block = numbered(flat, std::string(blocks) + "_");
    if (!block) continue;
    const auto part = numbered(block->second, "");
    if (!part) return std::nullopt;
    if (const auto m = sgm_part(part->second))
      return std::string(blocks) + "." + block->first + "." + part->first + "." + *m;
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

std::optional<lora::KohyaModule> kohya_unet_module(const std::string& flat, int64_t levels,
                                                   int64_t layers_per_block) {
  std::optional<std::string> module = diffusers_module(flat);
  if (!module)
    if (const auto dotted = sgm_dotted(flat)) module = sgm_unet_module(*dotted, levels, layers_per_block);
  if (!module) return std::nullopt;
  return lora::KohyaModule{*module};
}

lora::LoraFamily stable_diffusion_lora_family(int64_t levels, int64_t layers_per_block) {
  lora::LoraFamily family{.name = "Stable Diffusion",
                          .components = {"unet", "text_encoder", "text_encoder_2"},
                          .fuse_components = {"unet", "text_encoder", "text_encoder_2"},
                          .formats = {lora::LoraFormat::Diffusers, lora::LoraFormat::Kohya},
                          .denoiser = "unet"};
  family.kohya_denoiser_module = [levels, layers_per_block](const std::string& flat) {
    return kohya_unet_module(flat, levels, layers_per_block);
  };
  family.clip_text_encoder = true;
  family.clip_text_encoder_2 = true;
  return family;
}

}  // namespace kiln::models
