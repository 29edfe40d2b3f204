#include "kiln/lora/lora_keys.h"

#include <algorithm>
#include <map>

#include "kiln/core/error.h"
#include "lora/original_layout.h"

namespace kiln::lora {

const char* format_name(LoraFormat format) {
  switch (format) {
    case LoraFormat::Diffusers:
      return "diffusers (PEFT)";
    case LoraFormat::Kohya:
      return "kohya (sd-scripts)";
    case LoraFormat::BlackForestLabs:
      return "Black Forest Labs";
    case LoraFormat::XLabs:
      return "XLabs";
  }
  return "?";
}

bool LoraFamily::takes(LoraFormat format) const {
  return format == LoraFormat::Diffusers ||
         std::find(formats.begin(), formats.end(), format) != formats.end();
}

namespace {

enum class Role { Down, Up, Alpha };

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The key without the wrappers trainers put around Black Forest Labs' or diffusers' names.
std::string unwrapped(const std::string& key) {
  for (const char* prefix : {"diffusion_model.", "base_model.model."})
    if (starts_with(key, prefix)) return key.substr(std::string(prefix).size());
  return key;
}

std::string first_segment(const std::string& s) {
  return s.substr(0, s.find('.'));
}

// The module a tensor belongs to and its role, from the name's suffix.
std::optional<std::pair<std::string, Role>> module_and_role(const std::string& key, LoraFormat format) {
  static const std::vector<std::pair<std::string, Role>> lora_suffixes = {{".lora_A.weight", Role::Down},
                                                                          {".lora_B.weight", Role::Up},
                                                                          {".lora_down.weight", Role::Down},
                                                                          {".lora_up.weight", Role::Up},
                                                                          {".alpha", Role::Alpha}};
  static const std::vector<std::pair<std::string, Role>> xlabs_suffixes = {
      {".down.weight", Role::Down}, {".up.weight", Role::Up}, {".alpha", Role::Alpha}};
  for (const auto& [suffix, role] : format == LoraFormat::XLabs ? xlabs_suffixes : lora_suffixes)
    if (ends_with(key, suffix) && key.size() > suffix.size())
      return std::make_pair(key.substr(0, key.size() - suffix.size()), role);
  return std::nullopt;
}

bool is_kohya_key(const std::string& key) {
  for (const char* prefix : {"lora_unet_", "lora_te_", "lora_te1_", "lora_te2_", "lora_te3_"})
    if (starts_with(key, prefix)) return true;
  return false;
}

bool is_xlabs_key(const std::string& key) {
  return key.find(".processor.") != std::string::npos && key.find("_lora") != std::string::npos;
}

bool is_bfl_key(const std::string& key, const LoraFamily* family) {
  return is_original_top_level_name(first_segment(unwrapped(key)), family) ||
         starts_with(key, "text_encoders.");
}

bool looks_like_lora_tensor(const std::string& key) {
  return module_and_role(key, LoraFormat::Diffusers).has_value() ||
         module_and_role(key, LoraFormat::XLabs).has_value();
}

// Where a pair goes: its targets, or why it is skipped or unknown.
struct Mapping {
  std::vector<LoraTarget> targets;
  bool swap_up_halves = false;
  std::string skip;     // non-empty: diffusers ignores it too
  std::string unknown;  // non-empty: no rule accounts for it
};

Mapping unknown(std::string why) {
  Mapping m;
  m.unknown = std::move(why);
  return m;
}

Mapping skipped(std::string why) {
  Mapping m;
  m.skip = std::move(why);
  return m;
}

Mapping transformer_targets(const std::string& dotted, const LoraFamily& family) {
  const auto t = original_module_targets(family.original, dotted);
  if (!t) return unknown("not a module of the " + family.name + " " + family.denoiser);
  Mapping m;
  for (const std::string& module : t->modules) m.targets.push_back({family.denoiser, module});
  m.swap_up_halves = t->swap_up_halves;
  return m;
}

Mapping clip_targets(const std::string& flat, const LoraFamily& family,
                     const std::string& component = "text_encoder") {
  if (!family.clip_text_encoder) return skipped("diffusers loads no text-encoder LoRA into " + family.name);
  if (const auto dotted = clip_dotted_name(flat)) return Mapping{{{component, *dotted}}, false, "", ""};
  if (flat.find("text_projection") != std::string::npos ||
      flat.find("position_embedding") != std::string::npos)
    return skipped("CLIP's text_projection and position_embedding: diffusers drops them too");
  return unknown("not an attention or MLP layer of CLIP's encoder");
}

Mapping diffusers_mapping(const std::string& module, const LoraFamily& family) {
  std::string component, rest;
  if (starts_with(module, "diffusion_model.") || starts_with(module, "base_model.model.")) {
    component = "transformer";
    rest = unwrapped(module);
  } else {
    const size_t dot = module.find('.');
    if (dot == std::string::npos) return unknown("no component prefix (transformer., text_encoder., ...)");
    component = module.substr(0, dot);
    rest = module.substr(dot + 1);
  }
  if (rest.empty()) return unknown("no module after the component");
  const std::vector<std::string>& takes = family.components;
  if (std::find(takes.begin(), takes.end(), component) != takes.end())
    return Mapping{{{component, rest}}, false, "", ""};
  if (starts_with(component, "text_encoder"))
    return skipped("diffusers loads no LoRA into " + family.name + "'s " + component);
  std::string list;
  for (const std::string& c : takes) list += (list.empty() ? "" : ", ") + c;
  return unknown("component '" + component + "' is not one " + family.name + " pipelines load LoRA into (" +
                 list + ")");
}

Mapping kohya_mapping(const std::string& module, const LoraFamily& family) {
  if (starts_with(module, "lora_unet_")) {
    const std::string flat = module.substr(10);
    if (family.kohya_denoiser_module) {
      if (const auto found = family.kohya_denoiser_module(flat))
        return Mapping{{{family.denoiser, found->module}}, false, "", ""};
      return unknown("not a module of the " + family.name + " " + family.denoiser);
    }
    const auto dotted = original_dotted_name(family.original, flat);
    if (!dotted) return unknown("not a module of the " + family.name + " " + family.denoiser);
    return transformer_targets(*dotted, family);
  }
  for (const char* prefix : {"lora_te1_", "lora_te_"})
    if (starts_with(module, prefix)) return clip_targets(module.substr(std::string(prefix).size()), family);
  if (family.clip_text_encoder_2 && starts_with(module, "lora_te2_"))
    return clip_targets(module.substr(9), family, "text_encoder_2");
  if (starts_with(module, "lora_te2_") || starts_with(module, "lora_te3_"))
    return skipped("a T5 (lora_te2_ / lora_te3_) LoRA: diffusers loads none");
  return unknown(std::string("not a kohya name (lora_unet_*, lora_te1_* or lora_te_*") +
                 (family.clip_text_encoder_2 ? ", lora_te2_*)" : ")"));
}

Mapping bfl_mapping(const std::string& module, const LoraFamily& family) {
  const std::string clip_prefix = "text_encoders.clip_l.transformer.";
  if (starts_with(module, clip_prefix)) {
    std::string flat = module.substr(clip_prefix.size());
    std::replace(flat.begin(), flat.end(), '.', '_');
    return clip_targets(flat, family);
  }
  if (starts_with(module, "text_encoders."))
    return skipped("a T5 LoRA (text_encoders.t5xxl): diffusers loads none");
  return transformer_targets(unwrapped(module), family);
}

Mapping xlabs_mapping(const std::string& module) {
  const std::string body = unwrapped(module);
  const size_t processor = body.find(".processor.");
  if (processor == std::string::npos) return unknown("not an XLabs processor LoRA");
  const std::string block = body.substr(0, processor), lora = body.substr(processor + 11);
  const bool is_double = starts_with(block, "double_blocks.");
  const bool is_single = starts_with(block, "single_blocks.");
  const std::string number = block.substr(block.find('.') + 1);
  if ((!is_double && !is_single) || number.empty() || number.size() > 6 ||
      !std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return unknown("not an XLabs double_blocks.N / single_blocks.N processor");
  const std::string at = (is_double ? "transformer_blocks." : "single_transformer_blocks.") + number + ".";
  std::vector<std::string> modules;
  if (is_double && lora == "qkv_lora1") modules = {"attn.to_q", "attn.to_k", "attn.to_v"};
  if (is_double && lora == "qkv_lora2") modules = {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"};
  if (is_double && lora == "proj_lora1") modules = {"attn.to_out.0"};
  if (is_double && lora == "proj_lora2") modules = {"attn.to_add_out"};
  if (is_single && lora == "qkv_lora") modules = {"attn.to_q", "attn.to_k", "attn.to_v"};
  if (is_single && lora == "proj_lora") modules = {"proj_out"};
  if (modules.empty())
    return unknown("not an XLabs LoRA (qkv_lora1/2, proj_lora1/2; single blocks: qkv_lora, proj_lora)");
  Mapping m;
  for (const std::string& name : modules) m.targets.push_back({"transformer", at + name});
  return m;
}

Mapping mapping_of(const std::string& module, LoraFormat format, const LoraFamily& family) {
  switch (format) {
    case LoraFormat::Diffusers:
      return diffusers_mapping(module, family);
    case LoraFormat::Kohya:
      return kohya_mapping(module, family);
    case LoraFormat::BlackForestLabs:
      return bfl_mapping(module, family);
    case LoraFormat::XLabs:
      return xlabs_mapping(module);
  }
  return unknown("internal: unknown layout");
}

// Tensors that are not low-rank pairs: refused (Kiln would run them wrongly), or skipped as diffusers skips
// them (returns why; empty for a tensor of a pair).
std::string other_kind(const std::string& key) {
  KILN_CHECK(
      !(ends_with(key, ".lora_B.bias") || ends_with(key, ".lora_A.bias") || ends_with(key, ".lora_up.bias")),
      "LoRA tensor '" << key << "': adapters with biases (lora_bias) are not supported");
  KILN_CHECK(key.find("lora_magnitude_vector") == std::string::npos,
             "LoRA tensor '" << key << "': DoRA adapters (lora_magnitude_vector) are not supported");
  if (ends_with(key, ".dora_scale")) return "a DoRA scale: diffusers drops these too";
  if (ends_with(key, ".diff") || ends_with(key, ".diff_b"))
    return "a full-weight difference: diffusers drops these too";
  return "";
}

}  // namespace

std::optional<LoraFormat> detect_lora_format(const std::vector<std::string>& names,
                                             const LoraFamily* family) {
  if (std::none_of(names.begin(), names.end(), looks_like_lora_tensor)) return std::nullopt;
  if (std::any_of(names.begin(), names.end(), is_kohya_key)) return LoraFormat::Kohya;
  if (std::any_of(names.begin(), names.end(), is_xlabs_key)) return LoraFormat::XLabs;
  if (std::any_of(names.begin(), names.end(),
                  [&](const std::string& key) { return is_bfl_key(key, family); }))
    return LoraFormat::BlackForestLabs;
  return LoraFormat::Diffusers;
}

LoraKeys plan_lora_keys(const std::vector<std::string>& names, const LoraFamily& family) {
  const auto format = detect_lora_format(names, &family);
  KILN_CHECK(format, "not a LoRA file: none of its "
                         << names.size()
                         << " tensors is named like a LoRA's (.lora_A.weight / "
                            ".lora_B.weight, .lora_down.weight / .lora_up.weight)"
                         << (names.empty() ? "" : "; the first is '" + names.front() + "'"));
  if (!family.takes(*format)) {
    std::string taken;
    for (LoraFormat f :
         {LoraFormat::Diffusers, LoraFormat::Kohya, LoraFormat::BlackForestLabs, LoraFormat::XLabs})
      if (family.takes(f)) taken += std::string(taken.empty() ? "" : ", ") + format_name(f);
    KILN_FAIL("LoRA files in the " << format_name(*format) << " layout are not for " << family.name
                                   << ": its pipelines take " << taken << " ones, as diffusers does");
  }
  LoraKeys keys;
  keys.format = *format;
  std::vector<std::pair<size_t, std::pair<std::string, std::string>>> unknown_at, skipped_at;
  // The pairs by module, in the order their first tensor comes.
  struct Group {
    size_t first;
    std::string down, up, alpha;
  };
  std::map<std::string, size_t> group_of;
  std::vector<std::pair<std::string, Group>> groups;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& key = names[i];
    if (const std::string why = other_kind(key); !why.empty()) {
      skipped_at.push_back({i, {key, why}});
      continue;
    }
    const auto parsed = module_and_role(key, *format);
    if (!parsed) {
      unknown_at.push_back(
          {i,
           {key, format == LoraFormat::XLabs ? "not a LoRA tensor (expected .down.weight, .up.weight)"
                                             : "not a LoRA tensor (expected .lora_A.weight, "
                                               ".lora_B.weight, .lora_down.weight, "
                                               ".lora_up.weight or .alpha)"}});
      continue;
    }
    const auto [it, added] = group_of.try_emplace(parsed->first, groups.size());
    if (added) groups.push_back({parsed->first, Group{i, "", "", ""}});
    Group& g = groups[it->second].second;
    std::string& slot = parsed->second == Role::Down ? g.down : parsed->second == Role::Up ? g.up : g.alpha;
    if (!slot.empty()) {
      unknown_at.push_back({i, {key, "a second tensor for the same role as '" + slot + "'"}});
      continue;
    }
    slot = key;
  }
  for (const auto& [module, g] : groups) {
    if (g.down.empty() || g.up.empty()) {
      const std::string& present = !g.down.empty() ? g.down : !g.up.empty() ? g.up : g.alpha;
      unknown_at.push_back({g.first,
                            {present, g.down.empty() ? "has no down (lora_A / lora_down) tensor"
                                                     : "has no up (lora_B / lora_up) tensor"}});
      continue;
    }
    const Mapping m = mapping_of(module, *format, family);
    if (!m.unknown.empty()) {
      unknown_at.push_back({g.first, {g.down, m.unknown}});
      continue;
    }
    if (!m.skip.empty()) {
      for (const std::string* t : {&g.down, &g.up, &g.alpha})
        if (!t->empty()) skipped_at.push_back({g.first, {*t, m.skip}});
      continue;
    }
    keys.pairs.push_back(LoraPairKeys{module, g.down, g.up, g.alpha, m.targets, m.swap_up_halves});
  }
  auto in_file_order = [](auto& list, auto& out) {
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [i, entry] : list) out.push_back(std::move(entry));
  };
  in_file_order(unknown_at, keys.unknown);
  in_file_order(skipped_at, keys.skipped);
  return keys;
}

}  // namespace kiln::lora
