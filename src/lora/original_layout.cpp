#include "lora/original_layout.h"

#include <algorithm>
#include <cctype>

namespace kiln::lora {

namespace {

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

const OriginalModule* find_module(const std::vector<OriginalModule>& modules, const std::string& name,
                                  bool flat) {
  for (const OriginalModule& m : modules)
    if ((flat ? flattened(m.name) : m.name) == name) return &m;
  return nullptr;
}

}  // namespace

std::vector<OriginalModule>& OriginalLayout::block(const std::string& original,
                                                   const std::string& diffusers) {
  for (OriginalBlocks& b : blocks)
    if (b.original == original) return b.modules;
  blocks.push_back({original, diffusers, {}});
  return blocks.back().modules;
}

std::optional<ModuleTargets> original_module_targets(const OriginalLayout& layout,
                                                     const std::string& dotted) {
  for (const OriginalBlocks& b : layout.blocks) {
    const auto parts = block_and_rest(dotted, b.original + ".", '.');
    if (!parts) continue;
    const OriginalModule* m = find_module(b.modules, parts->second, false);
    if (m == nullptr) return std::nullopt;
    ModuleTargets t;
    for (const std::string& module : m->modules)
      t.modules.push_back(b.diffusers + "." + parts->first + "." + module);
    t.swap_up_halves = m->swap_up_halves;
    return t;
  }
  if (const OriginalModule* m = find_module(layout.top_level, dotted, false))
    return ModuleTargets{m->modules, m->swap_up_halves};
  return std::nullopt;
}

std::optional<std::string> original_dotted_name(const OriginalLayout& layout, const std::string& flat) {
  for (const OriginalBlocks& b : layout.blocks) {
    const auto parts = block_and_rest(flat, flattened(b.original) + "_", '_');
    if (!parts) continue;
    const OriginalModule* m = find_module(b.modules, parts->second, true);
    if (m == nullptr) return std::nullopt;
    return b.original + "." + parts->first + "." + m->name;
  }
  if (const OriginalModule* m = find_module(layout.top_level, flat, true)) return m->name;
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

bool is_original_top_level_name(const std::string& segment, const LoraFamily* family) {
  static const std::vector<std::string> lineage = {"double_blocks",
                                                   "single_blocks",
                                                   "img_in",
                                                   "txt_in",
                                                   "time_in",
                                                   "vector_in",
                                                   "guidance_in",
                                                   "final_layer",
                                                   "distilled_guidance_layer",
                                                   "double_stream_modulation_img",
                                                   "double_stream_modulation_txt",
                                                   "single_stream_modulation"};
  if (std::find(lineage.begin(), lineage.end(), segment) != lineage.end()) return true;
  if (family == nullptr) return false;
  for (const OriginalBlocks& b : family->original.blocks)
    if (b.original == segment) return true;
  for (const OriginalModule& m : family->original.top_level)
    if (m.name.substr(0, m.name.find('.')) == segment) return true;
  return false;
}

}  // namespace kiln::lora
