#include "kiln/lora/lora_file.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "kiln/core/error.h"
#include "kiln/io/json_config.h"
#include "kiln/io/safetensors.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/layout.h"

namespace kiln::lora {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

double alpha_value(const io::SafetensorsFile& file, const std::string& name) {
  const io::TensorInfo& info = file.info(name);
  KILN_CHECK(shape_numel(info.shape) == 1, file.path() << ": alpha tensor '" << name
                                                       << "' must hold one value, has shape "
                                                       << shape_str(info.shape));
  const double alpha = file.tensor(name).to(float32).item();
  KILN_CHECK(std::isfinite(alpha), file.path() << ": alpha tensor '" << name << "' is " << alpha);
  return alpha;
}

// How PEFT's LoraConfig, as diffusers builds it for one component of a diffusers-format file, scales a module
// that has no .alpha tensor of its own.
struct ComponentAlphas {
  std::optional<double> common_alpha;  // PEFT's lora_alpha from the component's .alpha tensors
  std::optional<double> lora_alpha;    // lora_adapter_metadata
  std::map<std::string, double> alpha_pattern;
  bool rslora = false;

  double scale(const std::string& module, std::optional<double> own_alpha, int64_t rank) const {
    double alpha = static_cast<double>(rank);
    if (own_alpha) {
      alpha = *own_alpha;
    } else if (common_alpha) {
      alpha = *common_alpha;
    } else if (lora_alpha) {
      alpha = *lora_alpha;
      for (const auto& [pattern, value] : alpha_pattern)
        if (module == pattern || ends_with(module, "." + pattern)) alpha = value;
    }
    return alpha / (rslora ? std::sqrt(static_cast<double>(rank)) : static_cast<double>(rank));
  }
};

std::map<std::string, ComponentAlphas> diffusers_alphas(const io::SafetensorsFile& file,
                                                        const LoraKeys& keys) {
  std::map<std::string, ComponentAlphas> out;
  // diffusers passes the .alpha tensors to PEFT's LoraConfig as network_alphas and takes the most common
  // value as lora_alpha; torch tensors count by identity, so every alpha is "most common" once and the first
  // one (in the file's order) wins.
  std::map<std::string, std::string> component_of;
  for (const LoraPairKeys& pair : keys.pairs)
    if (!pair.alpha.empty()) component_of[pair.alpha] = pair.targets.front().component;
  for (const std::string& name : file.names()) {
    const auto it = component_of.find(name);
    if (it != component_of.end() && !out[it->second].common_alpha)
      out[it->second].common_alpha = alpha_value(file, name);
  }
  const auto meta = file.metadata().find("lora_adapter_metadata");
  if (meta == file.metadata().end()) return out;
  const io::JsonConfig config = io::JsonConfig::parse(meta->second, file.path() + ": lora_adapter_metadata");
  // The denoiser's entry is the transformer's, or the UNet family's unet.
  for (const std::string component : {"transformer", "unet", "text_encoder", "text_encoder_2"}) {
    const std::string p = component + ".";
    KILN_CHECK(!config.get_or<bool>(p + "use_dora", false),
               file.path() << ": a DoRA adapter (" << p << "use_dora): DoRA is not supported");
    KILN_CHECK(!config.get_or<bool>(p + "lora_bias", false),
               file.path() << ": an adapter with biases (" << p << "lora_bias): not supported");
    if (!config.has(p + "lora_alpha")) continue;
    ComponentAlphas& c = out[component];
    c.lora_alpha = config.get<double>(p + "lora_alpha");
    c.rslora = config.get_or<bool>(p + "use_rslora", false);
    if (config.has(p + "alpha_pattern")) {
      const io::JsonConfig pattern = config.object(p + "alpha_pattern");
      for (const std::string& key : pattern.keys())
        c.alpha_pattern[key.rfind('^', 0) == 0 ? key.substr(1) : key] = pattern.get<double>(key);
    }
  }
  return out;
}

// down [rank, n] widened to [rank, width] with zero columns.
Tensor padded(const Tensor& down, int64_t width) {
  return concat({down, Tensor::zeros({down.size(0), width - down.size(1)}, down.dtype())}, 1);
}

// A pair's share of one layer: the rows of up that feed it, and the width its down is padded to (0: none).
struct Share {
  LoraTarget target;
  nn::LoraLayer* layer = nullptr;
  int64_t rows = 0;
  int64_t padded_width = 0;
};

// Where a pair goes, with the shapes its tensors are read in; `why` non-empty: it fits nowhere, and why.
struct Shares {
  std::vector<Share> layers;
  Shape down_shape, up_shape;
  std::string why;
};

// A pair on one convolution (PEFT's lora.Conv2d; kohya's and LyCORIS' LoCon): down [rank, in, k, k], a
// convolution with the layer's kernel, and up [out, rank, 1, 1].
Shares convolution_share(const Shape& ds, const Shape& us, const LoraPairKeys& pair, nn::Conv2d& conv,
                         const std::map<const nn::LoraLayer*, std::string>& reached_by) {
  const LoraTarget& t = pair.targets.front();
  const int64_t k = conv.kernel();
  Shares out;
  out.down_shape = ds;
  out.up_shape = us;
  if (const auto seen = reached_by.find(&conv); seen != reached_by.end()) {
    out.why = "layer " + t.component + "." + t.module + " is also reached by '" + seen->second + "'";
    return out;
  }
  if (ds.size() == 4 && us.size() == 4 && ds[0] >= 1 && ds[1] == conv.in_channels() && ds[2] == k &&
      ds[3] == k && us[0] == conv.out_channels() && us[1] == ds[0] && us[2] == 1 && us[3] == 1) {
    out.layers.push_back(Share{t, &conv, us[0], 0});
    return out;
  }
  const std::string rank = ds.empty() ? "rank" : std::to_string(ds[0]);
  out.why = "down " + shape_str(ds) + " and up " + shape_str(us) + " do not fit the convolution " +
            t.component + "." + t.module + " of weight " +
            shape_str({conv.out_channels(), conv.in_channels(), k, k}) + " (expected down [" + rank + ", " +
            std::to_string(conv.in_channels()) + ", " + std::to_string(k) + ", " + std::to_string(k) +
            "] and up [" + std::to_string(conv.out_channels()) + ", " + rank + ", 1, 1])";
  return out;
}

// A pair on Linear layers: down [rank, in] and up [out, rank] (or a 1x1 convolution's [rank, in, 1, 1] and
// [out, rank, 1, 1] for a Linear stored as one, nn::Linear::is_pointwise_conv); a pair on several layers (a
// fused layer the model keeps apart) feeds each its rows of up.
Shares linear_shares(const Shape& down_shape, const Shape& up_shape, const LoraPairKeys& pair,
                     const LoraFamily& family, const LayerLookup& find,
                     const std::map<const nn::LoraLayer*, std::string>& reached_by) {
  Shares out;
  const bool four_d = down_shape.size() == 4 && up_shape.size() == 4;
  const bool pointwise =
      four_d && down_shape[2] == 1 && down_shape[3] == 1 && up_shape[2] == 1 && up_shape[3] == 1;
  const Shape ds = pointwise ? Shape{down_shape[0], down_shape[1]} : down_shape;
  const Shape us = pointwise ? Shape{up_shape[0], up_shape[1]} : up_shape;
  out.down_shape = ds;
  out.up_shape = us;
  if (four_d && !pointwise) {
    const LoraTarget& t = pair.targets.front();
    out.why = "down " + shape_str(down_shape) + " and up " + shape_str(up_shape) +
              " are a convolution's pair, but " + t.component + "." + t.module +
              " is a Linear (expected [rank, in] and [out, rank])";
    return out;
  }
  if (ds.size() != 2 || us.size() != 2 || ds[0] < 1 || ds[0] != us[1]) {
    out.why = "down " + shape_str(down_shape) + " and up " + shape_str(up_shape) +
              " are not a low-rank pair ([rank, in] and [out, rank])";
    return out;
  }
  int64_t rows = 0;
  for (const LoraTarget& t : pair.targets) {
    nn::LoraLayer* const found = find(t.component, t.module);
    auto* const layer = dynamic_cast<nn::Linear*>(found);
    if (found == nullptr) {
      out.why = "the model has no layer " + t.component + "." + t.module;
    } else if (layer == nullptr) {
      out.why = "layer " + t.component + "." + t.module + " is a convolution, which one pair alone reaches";
    } else if (const auto seen = reached_by.find(layer); seen != reached_by.end()) {
      out.why = "layer " + t.component + "." + t.module + " is also reached by '" + seen->second + "'";
    } else if (pointwise && !layer->is_pointwise_conv()) {
      out.why = "down " + shape_str(down_shape) + " and up " + shape_str(up_shape) +
                " are a 1x1 convolution's pair, but " + t.component + "." + t.module +
                " is a Linear (expected [rank, in] and [out, rank])";
    } else {
      const bool pad =
          family.pads_narrow_down && t.component == "transformer" && ds[1] < layer->in_features();
      if (ds[1] != layer->in_features() && !pad)
        out.why = "down " + shape_str(ds) + " does not fit layer " + t.component + "." + t.module + " of " +
                  std::to_string(layer->in_features()) + " input features";
      out.layers.push_back(Share{t, layer, layer->out_features(), pad ? layer->in_features() : 0});
      rows += layer->out_features();
    }
    if (!out.why.empty()) return out;
  }
  if (rows != us[0])
    out.why = "up " + shape_str(us) + " has " + std::to_string(us[0]) + " rows, but its layer" +
              (out.layers.size() > 1 ? "s have " : " has ") + std::to_string(rows) + " output features";
  else if (pair.swap_up_halves && us[0] % 2 != 0)
    out.why = "up " + shape_str(us) + " cannot be split into (shift, scale) halves";
  return out;
}

}  // namespace

LoraContents read_lora_file(const std::string& path, const LoraFamily& family, const LayerLookup& find,
                            bool ignore_mismatches) {
  const io::SafetensorsFile file(path);
  LoraKeys keys;
  try {
    keys = plan_lora_keys(file.names(), family);
  } catch (const Error& e) {
    KILN_FAIL(path << ": " << e.what());
  }
  LoraContents out;
  out.format = keys.format;
  out.skipped = keys.skipped;
  const std::string hint = " (a " + std::string(format_name(keys.format)) + " LoRA file for " + family.name +
                           "; load it with ignore_mismatches to skip what does not fit)";
  if (!keys.unknown.empty() && !ignore_mismatches)
    KILN_FAIL(path << ": tensor '" << keys.unknown.front().first << "': " << keys.unknown.front().second
                   << hint);
  for (const auto& u : keys.unknown) out.skipped.push_back(u);

  const auto alphas = keys.format == LoraFormat::Diffusers ? diffusers_alphas(file, keys)
                                                           : std::map<std::string, ComponentAlphas>{};
  std::map<const nn::LoraLayer*, std::string> reached_by;
  for (const LoraPairKeys& pair : keys.pairs) {
    const io::TensorInfo& down_info = file.info(pair.down);
    const io::TensorInfo& up_info = file.info(pair.up);
    // A pair whose one target is a convolution is a convolution's (LoCon); the others are Linears'.
    const LoraTarget& first = pair.targets.front();
    nn::LoraLayer* const first_layer = find(first.component, first.module);
    auto* const conv = pair.targets.size() == 1 ? dynamic_cast<nn::Conv2d*>(first_layer) : nullptr;
    Shares shares;
    if (first_layer == nullptr)
      shares.why = "the model has no layer " + first.component + "." + first.module;
    else if (conv != nullptr)
      shares = convolution_share(down_info.shape, up_info.shape, pair, *conv, reached_by);
    else
      shares = linear_shares(down_info.shape, up_info.shape, pair, family, find, reached_by);
    std::string why = shares.why;
    if (why.empty() && (!is_floating(down_info.dtype) || !is_floating(up_info.dtype)))
      why = "down and up must be floating point, got " + std::string(dtype_name(down_info.dtype)) + " and " +
            std::string(dtype_name(up_info.dtype));
    if (!why.empty()) {
      KILN_CHECK(ignore_mismatches,
                 path << ": tensor '" << pair.down << "' (" << pair.name << "): " << why << hint);
      out.skipped.emplace_back(pair.name, why);
      continue;
    }
    const Tensor down = file.tensor(pair.down).reshape(shares.down_shape);
    Tensor up = file.tensor(pair.up).reshape(shares.up_shape);
    const int64_t rank = shares.down_shape[0], rows = shares.up_shape[0];
    if (pair.swap_up_halves) up = concat({up.narrow(0, rows / 2, rows / 2), up.narrow(0, 0, rows / 2)}, 0);
    const std::optional<double> own_alpha =
        pair.alpha.empty() ? std::nullopt : std::optional<double>(alpha_value(file, pair.alpha));
    const auto component_alphas = alphas.find(first.component);
    const double scale = component_alphas != alphas.end()
                             ? component_alphas->second.scale(first.module, own_alpha, rank)
                             : own_alpha.value_or(static_cast<double>(rank)) / static_cast<double>(rank);
    int64_t offset = 0;
    for (const Share& share : shares.layers) {
      LayerAdapter l{share.target, share.layer, down, up.narrow(0, offset, share.rows), scale, pair.name};
      offset += share.rows;
      if (share.padded_width > 0) l.down = padded(down, share.padded_width);
      reached_by[l.layer] = pair.name;
      out.layers.push_back(std::move(l));
    }
  }
  return out;
}

}  // namespace kiln::lora
