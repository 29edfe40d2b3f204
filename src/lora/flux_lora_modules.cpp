#include "lora/flux_lora_modules.h"

#include <algorithm>
#include <cctype>

namespace kiln::lora {

namespace {

struct Entry {
  const char* name;  // Black Forest Labs' name, relative to its block for block modules
  std::vector<std::string> modules;
  bool swap = false;
};

const std::vector<Entry>& double_block(ModelFamily family) {
  static const std::vector<Entry> flux1 = {
      {"img_attn.qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}},
      {"txt_attn.qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
      {"img_attn.proj", {"attn.to_out.0"}},
      {"txt_attn.proj", {"attn.to_add_out"}},
      {"img_mlp.0", {"ff.net.0.proj"}},
      {"img_mlp.2", {"ff.net.2"}},
      {"txt_mlp.0", {"ff_context.net.0.proj"}},
      {"txt_mlp.2", {"ff_context.net.2"}},
      {"img_mod.lin", {"norm1.linear"}},
      {"txt_mod.lin", {"norm1_context.linear"}},
  };
  // FLUX.2's blocks have no modulation of their own (it is shared) and a SwiGLU feed-forward.
  static const std::vector<Entry> flux2 = {
      {"img_attn.qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}},
      {"txt_attn.qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
      {"img_attn.proj", {"attn.to_out.0"}},
      {"txt_attn.proj", {"attn.to_add_out"}},
      {"img_mlp.0", {"ff.linear_in"}},
      {"img_mlp.2", {"ff.linear_out"}},
      {"txt_mlp.0", {"ff_context.linear_in"}},
      {"txt_mlp.2", {"ff_context.linear_out"}},
  };
  return family == ModelFamily::Flux2 ? flux2 : flux1;
}

const std::vector<Entry>& single_block(ModelFamily family) {
  // FLUX.1's linear1 is [q | k | v | mlp], which diffusers keeps as four layers; FLUX.2 keeps it fused.
  static const std::vector<Entry> flux1 = {
      {"linear1", {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"}},
      {"linear2", {"proj_out"}},
      {"modulation.lin", {"norm.linear"}},
  };
  static const std::vector<Entry> flux2 = {
      {"linear1", {"attn.to_qkv_mlp_proj"}},
      {"linear2", {"attn.to_out"}},
  };
  return family == ModelFamily::Flux2 ? flux2 : flux1;
}

const std::vector<Entry>& top_level(ModelFamily family) {
  static const std::vector<Entry> flux1 = {
      {"img_in", {"x_embedder"}},
      {"txt_in", {"context_embedder"}},
      {"time_in.in_layer", {"time_text_embed.timestep_embedder.linear_1"}},
      {"time_in.out_layer", {"time_text_embed.timestep_embedder.linear_2"}},
      {"vector_in.in_layer", {"time_text_embed.text_embedder.linear_1"}},
      {"vector_in.out_layer", {"time_text_embed.text_embedder.linear_2"}},
      {"guidance_in.in_layer", {"time_text_embed.guidance_embedder.linear_1"}},
      {"guidance_in.out_layer", {"time_text_embed.guidance_embedder.linear_2"}},
      {"final_layer.linear", {"proj_out"}},
      {"final_layer.adaLN_modulation.1", {"norm_out.linear"}, true},
  };
  static const std::vector<Entry> flux2 = {
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
  return family == ModelFamily::Flux2 ? flux2 : flux1;
}

std::string flattened(std::string name) {
  std::replace(name.begin(), name.end(), '.', '_');
  return name;
}

// "<prefix><digits><separator><rest>": the block number (at most 6 digits) and the rest.
std::optional<std::pair<std::string, std::string>> block_and_rest(const std::string& name,
                                                                  const std::string& prefix, char separator) {
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  size_t i = prefix.size(), digits = 0;
  while (i + digits < name.size() && std::isdigit(static_cast<unsigned char>(name[i + digits]))) ++digits;
  if (digits == 0 || digits > 6 || i + digits >= name.size() || name[i + digits] != separator)
    return std::nullopt;
  return std::make_pair(name.substr(i, digits), name.substr(i + digits + 1));
}

const Entry* find_entry(const std::vector<Entry>& entries, const std::string& name, bool flat) {
  for (const Entry& e : entries)
    if ((flat ? flattened(e.name) : std::string(e.name)) == name) return &e;
  return nullptr;
}

}  // namespace

std::optional<FluxModuleTargets> flux_module_targets(const std::string& dotted, ModelFamily family) {
  auto in_block = [&](const std::vector<Entry>& entries, const std::string& bfl_prefix,
                      const std::string& diffusers_prefix) -> std::optional<FluxModuleTargets> {
    const auto parts = block_and_rest(dotted, bfl_prefix, '.');
    if (!parts) return std::nullopt;
    const Entry* e = find_entry(entries, parts->second, false);
    if (e == nullptr) return std::nullopt;
    FluxModuleTargets t;
    for (const std::string& m : e->modules) t.modules.push_back(diffusers_prefix + parts->first + "." + m);
    return t;
  };
  if (auto t = in_block(double_block(family), "double_blocks.", "transformer_blocks.")) return t;
  if (auto t = in_block(single_block(family), "single_blocks.", "single_transformer_blocks.")) return t;
  if (const Entry* e = find_entry(top_level(family), dotted, false))
    return FluxModuleTargets{e->modules, e->swap};
  return std::nullopt;
}

std::optional<std::string> flux_dotted_name(const std::string& flat, ModelFamily family) {
  for (const auto& [prefix, entries] :
       {std::make_pair(std::string("double_blocks_"), &double_block(family)),
        std::make_pair(std::string("single_blocks_"), &single_block(family))}) {
    const auto parts = block_and_rest(flat, prefix, '_');
    if (!parts) continue;
    const Entry* e = find_entry(*entries, parts->second, true);
    if (e == nullptr) return std::nullopt;
    return prefix.substr(0, prefix.size() - 1) + "." + parts->first + "." + e->name;
  }
  if (const Entry* e = find_entry(top_level(family), flat, true)) return std::string(e->name);
  return std::nullopt;
}

std::optional<std::string> clip_dotted_name(const std::string& flat) {
  static const std::vector<std::pair<std::string, std::string>> layers = {
      {"self_attn_q_proj", "self_attn.q_proj"},
      {"self_attn_k_proj", "self_attn.k_proj"},
      {"self_attn_v_proj", "self_attn.v_proj"},
      {"self_attn_out_proj", "self_attn.out_proj"},
      {"mlp_fc1", "mlp.fc1"},
      {"mlp_fc2", "mlp.fc2"}};
  const auto parts = block_and_rest(flat, "text_model_encoder_layers_", '_');
  if (!parts) return std::nullopt;
  for (const auto& [kohya, dotted] : layers)
    if (parts->second == kohya) return "text_model.encoder.layers." + parts->first + "." + dotted;
  return std::nullopt;
}

bool is_flux_top_level_name(const std::string& segment) {
  static const std::vector<std::string> names = {"double_blocks",
                                                 "single_blocks",
                                                 "img_in",
                                                 "txt_in",
                                                 "time_in",
                                                 "vector_in",
                                                 "guidance_in",
                                                 "final_layer",
                                                 "double_stream_modulation_img",
                                                 "double_stream_modulation_txt",
                                                 "single_stream_modulation"};
  return std::find(names.begin(), names.end(), segment) != names.end();
}

}  // namespace kiln::lora
