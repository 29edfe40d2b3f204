#include "families/stable_diffusion/sd_single_file.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "kiln/core/error.h"
#include "kiln/nn/mapped_weights.h"
#include "kiln/nn/weight_file.h"

namespace kiln::models {

namespace {

constexpr const char* kUnet = "model.diffusion_model.";
constexpr const char* kClip = "cond_stage_model.transformer.";              // SD1.x's CLIP-L
constexpr const char* kXlClip = "conditioner.embedders.0.transformer.";     // SDXL's CLIP-L
constexpr const char* kXlOpenClip = "conditioner.embedders.1.model.";       // SDXL's OpenCLIP bigG
constexpr const char* kRefinerOpenClip = "conditioner.embedders.0.model.";  // the refiner's bigG, alone
constexpr const char* kVae = "first_stage_model.";
// stable-diffusion.cpp's names (what `sd -M convert` writes, src/name_conversion.cpp): the UNet, the VAE and
// SD1.x's CLIP-L keep the original names; SDXL's CLIP-L moves to kClip, bigG to this prefix in transformers'
// names (q/k/v still fused as self_attn.in_proj, text_model.text_projection as OpenCLIP holds it), and the
// refiner's lone bigG to kClip in those names.
constexpr const char* kSdcppOpenClip = "cond_stage_model.1.transformer.";
constexpr const char* kSd2OpenClip = "cond_stage_model.model.";  // SD2.x's OpenCLIP-H

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

bool any_under(const std::vector<std::string>& names, const std::string& prefix) {
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& n) { return starts_with(n, prefix); });
}

std::vector<std::string> split(const std::string& name) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot; (dot = name.find('.', start)) != std::string::npos; start = dot + 1)
    parts.push_back(name.substr(start, dot - start));
  parts.push_back(name.substr(start));
  return parts;
}

std::string join(const std::vector<std::string>& parts, size_t from) {
  std::string out;
  for (size_t i = from; i < parts.size(); ++i) out += (i > from ? "." : "") + parts[i];
  return out;
}

std::optional<int64_t> index_of(const std::string& s) {
  if (s.empty() || s.size() > 9 ||
      !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(s);
}

// `rest` with its leading module `from` renamed `to` (whole dotted segments only).
std::optional<std::string> renamed_head(const std::string& rest, const std::string& from,
                                        const std::string& to) {
  if (!starts_with(rest, from + ".")) return std::nullopt;
  return to + rest.substr(from.size());
}

// How a file tensor is reshaped on its way to the model.
enum class Fix { None, ConvToMatrix, Transpose };

// One component of the file under diffusers' names: renames and row splits by nn::MappedWeights (zero-copy,
// quantized rows kept quantized), the few reshapes here. names() is exactly the component's tensors: what
// the file holds beside them is another component's or deliberately ignored, which the reader checked.
class ComponentWeights final : public nn::WeightSource {
 public:
  ComponentWeights(std::shared_ptr<const nn::WeightSource> file, nn::MappedWeights::Mapping mapping,
                   std::map<std::string, Fix> fixes, const std::string& component)
      : fixes_(std::move(fixes)), description_(file->description() + " (its " + component + ")") {
    for (const auto& [to, from] : mapping) names_.push_back(to);
    std::sort(names_.begin(), names_.end());
    mapped_ = std::make_unique<nn::MappedWeights>(std::move(file), std::move(mapping), "",
                                                  "Stable Diffusion single file (the original layout)");
  }

  bool contains(const std::string& name) const override { return mapped_->contains(name); }
  Shape shape(const std::string& name) const override {
    const Shape s = mapped_->shape(name);
    switch (fix(name)) {
      case Fix::ConvToMatrix:
        return {s[0], s[1]};
      case Fix::Transpose:
        return {s[1], s[0]};
      case Fix::None:
        break;
    }
    return s;
  }
  Tensor load(const std::string& name) const override {
    const Tensor t = mapped_->load(name);
    switch (fix(name)) {
      case Fix::ConvToMatrix:
        return t.reshape({t.size(0), t.size(1)});  // [C, C, 1, 1]: a view
      case Fix::Transpose:
        return t.transpose(0, 1).contiguous();
      case Fix::None:
        break;
    }
    return t;
  }
  // A reshaped tensor is loaded as plain values (load()): its stored blocks are laid out for the file's
  // shape.
  quant::QuantizedTensor load_quantized(const std::string& name) const override {
    return fix(name) == Fix::None ? mapped_->load_quantized(name) : quant::QuantizedTensor{};
  }
  std::vector<std::string> names() const override { return names_; }
  std::string description() const override { return description_; }

 private:
  Fix fix(const std::string& name) const {
    auto it = fixes_.find(name);
    return it == fixes_.end() ? Fix::None : it->second;
  }

  std::unique_ptr<nn::MappedWeights> mapped_;
  std::map<std::string, Fix> fixes_;
  std::vector<std::string> names_;
  std::string description_;
};

// A component's mapping as it is built from the file's names.
struct ComponentMapping {
  nn::MappingBuilder map;
  std::map<std::string, Fix> fixes;

  std::shared_ptr<const nn::WeightSource> view(const std::shared_ptr<const nn::WeightSource>& file,
                                               const std::string& component) {
    if (map.entries.empty()) return nullptr;
    return std::make_shared<ComponentWeights>(file, std::move(map.entries), std::move(fixes), component);
  }
};

// ---- UNet: ldm's UNetModel -> UNet2DConditionModel (convert_ldm_unet_checkpoint) ----

// Where each ldm input block goes: input_blocks.0 is conv_in, then each level's ResNets (with their
// attention at .1), then, except on the last level, a downsampler (input_blocks.i.0.op).
struct UnetLayout {
  struct Input {
    int64_t level = 0, layer = 0;
    bool downsampler = false;
  };
  std::map<int64_t, Input> inputs;
  int64_t levels = 0, layers_per_block = 0, output_blocks = 0;
  std::vector<int64_t> block_out_channels;
};

UnetLayout unet_layout(const nn::WeightSource& file, const std::vector<std::string>& names) {
  const std::string& where = file.description();
  std::set<int64_t> input_ids, output_ids;
  for (const auto& n : names) {
    if (!starts_with(n, kUnet)) continue;
    const auto parts = split(n.substr(std::string(kUnet).size()));
    if (parts.size() < 2) continue;
    if (parts[0] == "input_blocks" && index_of(parts[1])) input_ids.insert(*index_of(parts[1]));
    if (parts[0] == "output_blocks" && index_of(parts[1])) output_ids.insert(*index_of(parts[1]));
  }
  UnetLayout u;
  std::vector<int64_t> per_level;  // ResNets of each level
  int64_t level = 0, layer = 0;
  for (const int64_t i : input_ids) {
    if (i == 0) continue;
    const std::string block = std::string(kUnet) + "input_blocks." + std::to_string(i) + ".0.";
    if (file.contains(block + "op.weight")) {
      u.inputs[i] = {level, 0, true};
      per_level.push_back(layer);
      ++level;
      layer = 0;
      continue;
    }
    KILN_CHECK(file.contains(block + "out_layers.3.weight"),
               where << ": " << block << " is neither a ResNet block (out_layers.3.weight) nor a downsampler "
                     << "(op.weight): not the UNet of SD1.x, SD2.x or SDXL");
    if (layer == 0) u.block_out_channels.push_back(file.shape(block + "out_layers.3.weight")[0]);
    u.inputs[i] = {level, layer++, false};
  }
  per_level.push_back(layer);
  u.levels = level + 1;
  u.layers_per_block = per_level.front();
  for (size_t l = 0; l < per_level.size(); ++l)
    KILN_CHECK(per_level[l] == u.layers_per_block && per_level[l] > 0,
               where << ": the UNet's level " << l << " has " << per_level[l]
                     << " ResNet blocks where level 0 has " << u.layers_per_block
                     << " (diffusers' conversion takes one layers_per_block for all)");
  u.output_blocks = u.levels * (u.layers_per_block + 1);
  KILN_CHECK(output_ids.size() == static_cast<size_t>(u.output_blocks) &&
                 (output_ids.empty() || *output_ids.rbegin() == u.output_blocks - 1),
             where << ": the UNet has " << output_ids.size() << " output_blocks where " << u.levels
                   << " levels of " << u.layers_per_block << " ResNet blocks need " << u.output_blocks);
  return u;
}

std::optional<std::string> unet_resnet(const std::string& to, const std::string& rest) {
  static const std::pair<const char*, const char*> kRenames[] = {
      {"in_layers.0", "norm1"},  {"in_layers.2", "conv1"},  {"emb_layers.1", "time_emb_proj"},
      {"out_layers.0", "norm2"}, {"out_layers.3", "conv2"}, {"skip_connection", "conv_shortcut"},
  };
  for (const auto& [from, into] : kRenames)
    if (auto r = renamed_head(rest, from, into)) return to + *r;
  return std::nullopt;
}

// diffusers' name for `rest` (a UNet tensor's name without model.diffusion_model.), or none.
std::optional<std::string> unet_name(const std::string& rest, const UnetLayout& u) {
  static const std::pair<const char*, const char*> kTop[] = {
      {"time_embed.0", "time_embedding.linear_1"},
      {"time_embed.2", "time_embedding.linear_2"},
      {"label_emb.0.0", "add_embedding.linear_1"},
      {"label_emb.0.2", "add_embedding.linear_2"},
      {"input_blocks.0.0", "conv_in"},
      {"out.0", "conv_norm_out"},
      {"out.2", "conv_out"},
  };
  for (const auto& [from, into] : kTop)
    if (auto r = renamed_head(rest, from, into)) return r;
  const auto p = split(rest);
  if (p.size() < 3) return std::nullopt;
  const auto block = index_of(p[1]);
  if (!block) return std::nullopt;
  // middle_block.k: the ResNet, the attention, the ResNet.
  if (p[0] == "middle_block") {
    if (*block == 0 || *block == 2)
      return unet_resnet("mid_block.resnets." + std::to_string(*block / 2) + ".", join(p, 2));
    if (*block == 1) return "mid_block.attentions.0." + join(p, 2);
    return std::nullopt;
  }
  // input_blocks.i.k / output_blocks.i.k: the k-th module of the block.
  const auto part = index_of(p[2]);
  if (!part || p.size() < 4) return std::nullopt;
  const std::string tail = join(p, 3);
  if (p[0] == "input_blocks") {
    auto it = u.inputs.find(*block);
    if (it == u.inputs.end()) return std::nullopt;
    const auto& in = it->second;
    const std::string level = "down_blocks." + std::to_string(in.level) + ".";
    if (in.downsampler) {
      if (*part != 0) return std::nullopt;
      auto r = renamed_head(tail, "op", "conv");
      return r ? std::optional(level + "downsamplers.0." + *r) : std::nullopt;
    }
    if (*part == 0) return unet_resnet(level + "resnets." + std::to_string(in.layer) + ".", tail);
    if (*part == 1) return level + "attentions." + std::to_string(in.layer) + "." + tail;
    return std::nullopt;
  }
  if (p[0] == "output_blocks" && *block < u.output_blocks) {
    const int64_t per = u.layers_per_block + 1;
    const std::string level = "up_blocks." + std::to_string(*block / per) + ".";
    const std::string layer = std::to_string(*block % per);
    // ldm's output block: the ResNet, the attention (on levels that have them), then the upsampler.
    if (*part == 0) return unet_resnet(level + "resnets." + layer + ".", tail);
    if ((*part == 1 || *part == 2) && starts_with(tail, "conv.")) return level + "upsamplers.0." + tail;
    if (*part == 1) return level + "attentions." + layer + "." + tail;
  }
  return std::nullopt;
}

// ---- VAE: ldm's AutoencoderKL -> diffusers' (convert_ldm_vae_checkpoint) ----

std::optional<std::string> vae_resnet(const std::string& to, const std::string& rest) {
  for (const char* same : {"norm1", "conv1", "norm2", "conv2"})
    if (starts_with(rest, std::string(same) + ".")) return to + rest;
  if (auto r = renamed_head(rest, "nin_shortcut", "conv_shortcut")) return to + *r;
  return std::nullopt;
}

// diffusers' name for `rest` (a VAE tensor's name without first_stage_model.), or none; `conv_attention`
// is set for the mid attention's q/k/v/proj_out weights, which ldm holds as 1x1 convolutions.
std::optional<std::string> vae_name(const std::string& rest, int64_t up_levels, bool& conv_attention) {
  conv_attention = false;
  for (const char* same : {"quant_conv.", "post_quant_conv.", "encoder.conv_in.", "encoder.conv_out.",
                           "decoder.conv_in.", "decoder.conv_out."})
    if (starts_with(rest, same)) return rest;
  const auto p = split(rest);
  if (p.size() < 3 || (p[0] != "encoder" && p[0] != "decoder")) return std::nullopt;
  const std::string side = p[0] + ".";
  if (p[1] == "norm_out") return side + "conv_norm_out." + join(p, 2);
  if (p[1] == "mid") {
    if (p[2] == "block_1" || p[2] == "block_2")
      return vae_resnet(side + "mid_block.resnets." + (p[2] == "block_1" ? "0." : "1."), join(p, 3));
    if (p[2] != "attn_1" || p.size() != 5) return std::nullopt;
    static const std::map<std::string, std::string> kAttention = {
        {"norm", "group_norm"}, {"q", "to_q"}, {"k", "to_k"}, {"v", "to_v"}, {"proj_out", "to_out.0"}};
    auto it = kAttention.find(p[3]);
    if (it == kAttention.end()) return std::nullopt;
    conv_attention = p[3] != "norm" && p[4] == "weight";
    return side + "mid_block.attentions.0." + it->second + "." + p[4];
  }
  // encoder.down.i / decoder.up.i; ldm numbers the decoder's levels from the lowest resolution up, diffusers
  // in the order they run.
  const bool down = p[0] == "encoder" && p[1] == "down", up = p[0] == "decoder" && p[1] == "up";
  const auto level = index_of(p[2]);
  if ((!down && !up) || !level || p.size() < 5 || (up && *level >= up_levels)) return std::nullopt;
  const std::string to = side +
                         (down ? "down_blocks." + std::to_string(*level)
                               : "up_blocks." + std::to_string(up_levels - 1 - *level)) +
                         ".";
  if (p[3] == "block" && index_of(p[4])) return vae_resnet(to + "resnets." + p[4] + ".", join(p, 5));
  if (p[3] == (down ? "downsample" : "upsample") && p[4] == "conv")
    return to + (down ? "downsamplers" : "upsamplers") + ".0.conv." + join(p, 5);
  return std::nullopt;
}

// ---- the text encoders ----

// HF CLIP under ldm's wrapper: the names are transformers' (older files lack the text_model. level).
std::string clip_name(const std::string& rest) {
  return starts_with(rest, "text_model.") ? rest : "text_model." + rest;
}

bool is_position_ids(const std::string& rest) {
  return rest == "text_model.embeddings.position_ids" || rest == "embeddings.position_ids";
}

// OpenCLIP's text tower -> CLIPTextModelWithProjection (convert_open_clip_checkpoint). Adds to `m`; false
// when `rest` is none of its tensors.
bool add_open_clip(const nn::WeightSource& file, const std::string& name, const std::string& rest,
                   ComponentMapping& m) {
  static const std::map<std::string, std::string> kTop = {
      {"token_embedding.weight", "text_model.embeddings.token_embedding.weight"},
      {"positional_embedding", "text_model.embeddings.position_embedding.weight"},
      {"ln_final.weight", "text_model.final_layer_norm.weight"},
      {"ln_final.bias", "text_model.final_layer_norm.bias"},
  };
  if (auto it = kTop.find(rest); it != kTop.end()) {
    m.map.add(it->second, name);
    return true;
  }
  if (rest == "text_projection") {
    // OpenCLIP computes x @ text_projection ([width, projection]); the Linear holds its transpose.
    KILN_CHECK(file.shape(name).size() == 2,
               file.description() << ": " << name << " should be 2-d, got " << shape_str(file.shape(name)));
    m.map.add("text_projection.weight", name);
    m.fixes["text_projection.weight"] = Fix::Transpose;
    return true;
  }
  const auto p = split(rest);
  if (p.size() < 5 || p[0] != "transformer" || p[1] != "resblocks" || !index_of(p[2])) return false;
  const std::string layer = "text_model.encoder.layers." + p[2] + ".";
  const std::string tail = join(p, 3);
  if (tail == "attn.in_proj_weight" || tail == "attn.in_proj_bias") {
    // q, k and v stacked by rows, each the width of the tower.
    const int64_t rows = file.shape(name)[0];
    KILN_CHECK(rows % 3 == 0, file.description()
                                  << ": " << name << " has " << rows << " rows, not q, k and v of one width");
    const std::string kind = tail == "attn.in_proj_weight" ? ".weight" : ".bias";
    int64_t row = 0;
    for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
      m.map.add(layer + "self_attn." + proj + kind, name, row, row + rows / 3);
      row += rows / 3;
    }
    return true;
  }
  static const std::pair<const char*, const char*> kLayer[] = {
      {"ln_1", "layer_norm1"},
      {"ln_2", "layer_norm2"},
      {"mlp.c_fc", "mlp.fc1"},
      {"mlp.c_proj", "mlp.fc2"},
      {"attn.out_proj", "self_attn.out_proj"},
  };
  for (const auto& [from, into] : kLayer)
    if (auto r = renamed_head(tail, from, into)) {
      m.map.add(layer + *r, name);
      return true;
    }
  return false;
}

// OpenCLIP's text tower in transformers' names under stable-diffusion.cpp's prefix (`rest` without it) ->
// CLIPTextModelWithProjection: the names are the model's but the fused q/k/v rows, split here, and the
// projection, held as OpenCLIP's [width, projection]. Adds to `m`; false when `rest` is none of its tensors.
bool add_sdcpp_open_clip(const nn::WeightSource& file, const std::string& name, const std::string& rest,
                         ComponentMapping& m) {
  if (!starts_with(rest, "text_model.")) return false;
  if (rest == "text_model.text_projection") {
    KILN_CHECK(file.shape(name).size() == 2,
               file.description() << ": " << name << " should be 2-d, got " << shape_str(file.shape(name)));
    m.map.add("text_projection.weight", name);
    m.fixes["text_projection.weight"] = Fix::Transpose;
    return true;
  }
  for (const char* kind : {"weight", "bias"}) {
    const std::string fused = std::string(".self_attn.in_proj.") + kind;
    if (rest.size() <= fused.size() || rest.compare(rest.size() - fused.size(), fused.size(), fused) != 0)
      continue;
    const int64_t rows = file.shape(name)[0];
    KILN_CHECK(rows % 3 == 0, file.description()
                                  << ": " << name << " has " << rows << " rows, not q, k and v of one width");
    const std::string layer = rest.substr(0, rest.size() - fused.size()) + ".self_attn.";
    int64_t row = 0;
    for (const char* proj : {"q_proj.", "k_proj.", "v_proj."}) {
      m.map.add(layer + proj + kind, name, row, row + rows / 3);
      row += rows / 3;
    }
    return true;
  }
  m.map.add(rest, name);
  return true;
}

// What the format carries beside the weights and no model reads.
bool deliberately_ignored(const std::string& name) {
  // ldm's LatentDiffusion: the EMA copy of the UNet (model_ema.*, with its decay and num_updates) and the
  // DDPM schedule's buffers; sgm (SDXL): the discrete denoiser's sigmas.
  static const std::set<std::string> kBuffers = {
      "betas",
      "alphas_cumprod",
      "alphas_cumprod_prev",
      "sqrt_alphas_cumprod",
      "sqrt_one_minus_alphas_cumprod",
      "log_one_minus_alphas_cumprod",
      "sqrt_recip_alphas_cumprod",
      "sqrt_recipm1_alphas_cumprod",
      "posterior_variance",
      "posterior_log_variance_clipped",
      "posterior_mean_coef1",
      "posterior_mean_coef2",
      "lvlb_weights",
      "logvar",
      "scale_factor",
      "denoiser.sigmas",
  };
  if (kBuffers.count(name) || starts_with(name, "model_ema.")) return true;
  // The VAE's training loss (LPIPS and the discriminator) that some files keep.
  if (starts_with(name, std::string(kVae) + "loss.")) return true;
  // CLIP's position_ids buffer; OpenCLIP's contrastive temperature and causal mask.
  if (starts_with(name, kClip) && is_position_ids(name.substr(std::string(kClip).size()))) return true;
  if (starts_with(name, kXlClip) && is_position_ids(name.substr(std::string(kXlClip).size()))) return true;
  if (starts_with(name, kSdcppOpenClip) && is_position_ids(name.substr(std::string(kSdcppOpenClip).size())))
    return true;
  if (name == "cond_stage_model.1.model.logit_scale") return true;  // stable-diffusion.cpp's bigG
  for (const char* open_clip : {kXlOpenClip, kRefinerOpenClip, kSd2OpenClip})
    if (name == std::string(open_clip) + "logit_scale" || name == std::string(open_clip) + "attn_mask")
      return true;
  // SD2 reads OpenCLIP-H's penultimate layer through a CLIPTextModel of 23 layers and no projection:
  // diffusers' conversion skips the 24th layer (SD_2_TEXT_ENCODER_KEYS_TO_IGNORE) and the text encoder has no
  // parameter for text_projection.
  if (starts_with(name, std::string(kSd2OpenClip) + "transformer.resblocks.23.") ||
      name == std::string(kSd2OpenClip) + "text_projection")
    return true;
  return false;
}

// The file's top-level groups with their tensor counts ("double_blocks (38), final_layer (4)"), for the
// error that says what a file is not; the wrappers of the original layout are shown with their first level.
std::string top_level_groups(const std::vector<std::string>& names) {
  std::map<std::string, int64_t> groups;
  for (const auto& n : names) {
    const auto p = split(n);
    size_t depth = 1;  // model.diffusion_model.X, cond_stage_model.X, conditioner.embedders.N.X
    if (p[0] == "cond_stage_model" || p[0] == "first_stage_model") depth = 2;
    if (p[0] == "model") depth = 3;
    if (p[0] == "conditioner") depth = 4;
    ++groups[join(std::vector<std::string>(p.begin(), p.begin() + std::min(depth, p.size())), 0)];
  }
  std::string out;
  int64_t shown = 0;
  for (const auto& [group, count] : groups) {
    if (shown++ == 10) {
      out += ", ... (" + std::to_string(groups.size()) + " groups)";
      break;
    }
    out += (out.empty() ? "" : ", ") + group + " (" + std::to_string(count) + ")";
  }
  return out.empty() ? "no tensors" : out;
}

// The width of the UNet's cross-attention context: any attn2.to_k's inputs.
int64_t unet_cross_attention_dim(const nn::WeightSource& file, const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (starts_with(n, kUnet) && n.size() > 18 && n.compare(n.size() - 18, 18, ".attn2.to_k.weight") == 0)
      return file.shape(n).back();
  return 0;
}

}  // namespace

const char* kind_name(StableDiffusionSingleFile::Kind kind) {
  switch (kind) {
    case StableDiffusionSingleFile::Kind::SD2:
      return "SD2.x";
    case StableDiffusionSingleFile::Kind::SDXL:
      return "SDXL";
    case StableDiffusionSingleFile::Kind::SDXLRefiner:
      return "SDXL refiner";
    case StableDiffusionSingleFile::Kind::SD1:
      break;
  }
  return "SD1.x";
}

const char* single_file_class(StableDiffusionSingleFile::Kind kind, bool inpainting) {
  switch (kind) {
    case StableDiffusionSingleFile::Kind::SDXL:
      return inpainting ? "StableDiffusionXLInpaintPipeline" : "StableDiffusionXLPipeline";
    case StableDiffusionSingleFile::Kind::SDXLRefiner:
      // The refiner's own folder names its image-to-image class (it refines an image; diffusers'
      // text-to-image class fails on its 5 time ids); given a mask, callers pick the inpainting sibling.
      return inpainting ? "StableDiffusionXLInpaintPipeline" : "StableDiffusionXLImg2ImgPipeline";
    case StableDiffusionSingleFile::Kind::SD1:
    case StableDiffusionSingleFile::Kind::SD2:
      break;
  }
  return inpainting ? "StableDiffusionInpaintPipeline" : "StableDiffusionPipeline";
}

const char* default_config(StableDiffusionSingleFile::Kind kind, bool inpainting) {
  switch (kind) {
    case StableDiffusionSingleFile::Kind::SD2:
      // diffusers' DIFFUSERS_DEFAULT_PIPELINE_PATHS: "v2" (2.1, v-prediction at 768; a 512 epsilon file such
      // as 2.1-base needs its own configs) and "inpainting_v2" (512, epsilon, in_channels 9).
      return inpainting ? "stabilityai/stable-diffusion-2-inpainting" : "stabilityai/stable-diffusion-2-1";
    case StableDiffusionSingleFile::Kind::SDXL:
      return "stabilityai/stable-diffusion-xl-base-1.0";
    case StableDiffusionSingleFile::Kind::SDXLRefiner:
      return "stabilityai/stable-diffusion-xl-refiner-1.0";
    case StableDiffusionSingleFile::Kind::SD1:
      break;
  }
  return "stable-diffusion-v1-5/stable-diffusion-v1-5";
}

StableDiffusionSingleFile open_stable_diffusion_single_file(const std::string& path) {
  return read_stable_diffusion_single_file(nn::open_weight_file(path));
}

// A UNet alone under the original names without model.diffusion_model. (city96's ComfyUI-GGUF SD1.x / SDXL
// files, ComfyUI's extracted UNets), seen under that prefix; other files as they are.
std::shared_ptr<const nn::WeightSource> with_unet_prefix(std::shared_ptr<const nn::WeightSource> file) {
  if (!file->contains("input_blocks.0.0.weight") || !file->contains("out.2.weight") ||
      file->contains(std::string(kUnet) + "input_blocks.0.0.weight"))
    return file;
  nn::MappingBuilder map;
  for (const auto& n : file->names()) map.add(kUnet + n, n);
  return std::make_shared<nn::MappedWeights>(std::move(file), std::move(map.entries), "",
                                             "Stable Diffusion UNet without model.diffusion_model.");
}

StableDiffusionSingleFile read_stable_diffusion_single_file(std::shared_ptr<const nn::WeightSource> file) {
  file = with_unet_prefix(std::move(file));
  const std::string where = file->description();
  const std::vector<std::string> names = file->names();
  const std::string conv_in = std::string(kUnet) + "input_blocks.0.0.weight";
  const bool has_unet = file->contains(conv_in);
  const int64_t cross = has_unet ? unet_cross_attention_dim(*file, names) : 0;
  const bool xl_unet = file->contains(std::string(kUnet) + "label_emb.0.0.weight");

  KILN_CHECK(has_unet, where << ": neither SD1.x, SD2.x nor SDXL in the original layout (no UNet at "
                             << conv_in << "); the file's top-level keys: " << top_level_groups(names));
  // SD2.x by its text encoder, OpenCLIP-H, or, in a UNet-only file, its context width (diffusers'
  // infer_diffusers_model_type: "v2" for a 1024-wide attn2.to_k).
  const bool sd2 = !xl_unet && (any_under(names, kSd2OpenClip) || cross == 1024);

  // The refiner's sgm conditioner has one embedder, OpenCLIP bigG, at index 0 (diffusers' infer_diffusers_
  // model_type: "xl_refiner" for bigG's layers at conditioner.embedders.0.model with none at embedders.1);
  // its UNet alone is told by its context, bigG's 1280 wide (the base's is CLIP-L + bigG, 2048).
  const bool sdcpp_xl = any_under(names, kSdcppOpenClip);  // stable-diffusion.cpp's SDXL base names
  // stable-diffusion.cpp's refiner: bigG (its fused in_proj tells it from CLIP-L) where SD1.x's CLIP-L goes.
  const bool sdcpp_refiner_tower =
      xl_unet && !sdcpp_xl && std::any_of(names.begin(), names.end(), [](const std::string& n) {
        return starts_with(n, kClip) && n.find(".self_attn.in_proj.") != std::string::npos;
      });
  const bool refiner_tower = any_under(names, kRefinerOpenClip) || sdcpp_refiner_tower;
  const bool refiner_unet =
      xl_unet && cross == 1280 && !any_under(names, kXlOpenClip) && !any_under(names, kXlClip) && !sdcpp_xl;
  StableDiffusionSingleFile out;
  out.kind = refiner_tower || refiner_unet ? StableDiffusionSingleFile::Kind::SDXLRefiner
             : xl_unet || any_under(names, kXlOpenClip) || sdcpp_xl ? StableDiffusionSingleFile::Kind::SDXL
             : sd2                                                  ? StableDiffusionSingleFile::Kind::SD2
                                                                    : StableDiffusionSingleFile::Kind::SD1;
  const bool refiner = out.kind == StableDiffusionSingleFile::Kind::SDXLRefiner;
  const bool xl = refiner || out.kind == StableDiffusionSingleFile::Kind::SDXL;
  const Shape conv_in_shape = file->shape(conv_in);
  KILN_CHECK(conv_in_shape.size() == 4,
             where << ": " << conv_in << " should be a 4-d convolution, got " << shape_str(conv_in_shape));
  out.in_channels = conv_in_shape[1];
  // 4 latent channels, or an inpainting UNet's 9 (the latents, the mask and the masked image's latents).
  KILN_CHECK(out.in_channels == 4 || out.in_channels == 9,
             where << ": an " << kind_name(out.kind) << " UNet taking " << out.in_channels
                   << " input channels where text-to-image takes 4 latent channels and inpainting 9");
  out.cross_attention_dim = cross;

  const UnetLayout layout = unet_layout(*file, names);
  out.layers_per_block = layout.layers_per_block;
  out.block_out_channels = layout.block_out_channels;

  int64_t up_levels = 0;  // the VAE decoder's
  for (const auto& n : names) {
    const std::string up = std::string(kVae) + "decoder.up.";
    if (!starts_with(n, up)) continue;
    if (auto i = index_of(split(n.substr(up.size()))[0])) up_levels = std::max(up_levels, *i + 1);
  }

  ComponentMapping unet, te, te2, vae;
  // The refiner and SD2 have no CLIP-L: a file of theirs with one is refused below with the other stray
  // tensors.
  const bool reads_clip = !refiner && !sd2;
  const std::string clip_prefix = xl && !sdcpp_xl ? kXlClip : kClip;
  // stable-diffusion.cpp puts the refiner's bigG where SD1.x's CLIP-L goes, in transformers' names.
  const bool sdcpp_refiner = refiner && !any_under(names, kRefinerOpenClip) && any_under(names, kClip);
  const bool sdcpp_open_clip = sdcpp_xl || sdcpp_refiner;
  const std::string open_clip_prefix = sdcpp_refiner ? kClip
                                       : sdcpp_xl    ? kSdcppOpenClip
                                       : refiner     ? kRefinerOpenClip
                                                     : kXlOpenClip;
  std::vector<std::string> leftovers;
  for (const auto& n : names) {
    if (deliberately_ignored(n)) continue;
    bool used = false;
    if (starts_with(n, kUnet)) {
      if (auto to = unet_name(n.substr(std::string(kUnet).size()), layout)) {
        unet.map.add(*to, n);
        used = true;
      }
    } else if (reads_clip && starts_with(n, clip_prefix)) {
      te.map.add(clip_name(n.substr(clip_prefix.size())), n);
      used = true;
    } else if (xl && starts_with(n, open_clip_prefix)) {
      const std::string rest = n.substr(open_clip_prefix.size());
      used = sdcpp_open_clip ? add_sdcpp_open_clip(*file, n, rest, te2) : add_open_clip(*file, n, rest, te2);
    } else if (sd2 && starts_with(n, kSd2OpenClip)) {  // SD2's one text encoder, OpenCLIP-H
      used = add_open_clip(*file, n, n.substr(std::string(kSd2OpenClip).size()), te);
    } else if (starts_with(n, kVae)) {
      bool conv_attention = false;
      if (auto to = vae_name(n.substr(std::string(kVae).size()), up_levels, conv_attention)) {
        vae.map.add(*to, n);
        const Shape s = file->shape(n);
        if (conv_attention && s.size() == 4) {
          KILN_CHECK(s[2] == 1 && s[3] == 1, where << ": " << n << " is " << shape_str(s)
                                                   << ", expected a 1x1 convolution [C, C, 1, 1]");
          vae.fixes[*to] = Fix::ConvToMatrix;
        }
        used = true;
      }
    }
    if (!used) leftovers.push_back(n);
  }
  if (!leftovers.empty()) {
    std::string list;
    for (size_t i = 0; i < leftovers.size() && i < 8; ++i) list += (i ? ", " : "") + leftovers[i];
    if (leftovers.size() > 8) list += ", ...";
    KILN_FAIL(where << ": an " << kind_name(out.kind) << " single file with " << leftovers.size()
                    << " tensors that are no part of its UNet, text encoders or VAE in the original layout: "
                    << list);
  }
  KILN_CHECK(!xl || refiner || te.map.entries.empty() == te2.map.entries.empty(),
             where << ": an SDXL file with "
                   << (te.map.entries.empty() ? "OpenCLIP bigG but no CLIP-L" : "CLIP-L but no OpenCLIP bigG")
                   << "; SDXL needs both text encoders");
  out.unet = unet.view(file, "unet");
  out.text_encoder = te.view(file, "text_encoder");
  out.text_encoder_2 = te2.view(file, "text_encoder_2");
  out.vae = vae.view(file, "vae");
  return out;
}

std::optional<std::string> sgm_unet_module(const std::string& dotted, int64_t levels,
                                           int64_t layers_per_block) {
  if (levels < 1 || layers_per_block < 1) return std::nullopt;
  // The input blocks the UNet's config implies: each level's ResNets (with their attentions), then its
  // downsampler except on the last level; input_blocks.0 is conv_in.
  UnetLayout u;
  u.levels = levels;
  u.layers_per_block = layers_per_block;
  u.output_blocks = levels * (layers_per_block + 1);
  int64_t id = 1;
  for (int64_t level = 0; level < levels; ++level) {
    for (int64_t layer = 0; layer < layers_per_block; ++layer) u.inputs[id++] = {level, layer, false};
    if (level + 1 < levels) u.inputs[id++] = {level, 0, true};
  }
  const auto name = unet_name(dotted + ".weight", u);
  if (!name || name->size() < 7 || name->compare(name->size() - 7, 7, ".weight") != 0) return std::nullopt;
  return name->substr(0, name->size() - 7);
}

}  // namespace kiln::models
