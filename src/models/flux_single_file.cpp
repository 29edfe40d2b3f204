#include "kiln/models/flux_single_file.h"

#include <algorithm>
#include <set>

#include "kiln/ops/layout.h"

namespace kiln::models {

namespace {

using Entry = FluxSingleFileWeights::Entry;

constexpr const char* kComfyPrefix = "model.diffusion_model.";

// Adds `diffusers_name` <- rows [begin, end) of `bfl_name`.
struct Mapping {
  std::vector<std::pair<std::string, Entry>> entries;
  void add(const std::string& to, const std::string& from, int64_t begin = 0, int64_t end = -1,
           bool swap = false) {
    entries.emplace_back(to, Entry{from, begin, end, swap});
  }
  // weight and bias of a Linear.
  void linear(const std::string& to, const std::string& from) {
    add(to + ".weight", from + ".weight");
    add(to + ".bias", from + ".bias");
  }
  // Consecutive row ranges of a fused weight and bias: `parts` are (diffusers Linear, rows).
  void split(const std::string& from, const std::vector<std::pair<std::string, int64_t>>& parts) {
    int64_t row = 0;
    for (const auto& [to, rows] : parts) {
      add(to + ".weight", from + ".weight", row, row + rows);
      add(to + ".bias", from + ".bias", row, row + rows);
      row += rows;
    }
  }
};

std::vector<std::pair<std::string, Entry>> flux_mapping(const FluxTransformerConfig& c) {
  const int64_t d = c.inner_dim();
  Mapping m;
  m.linear("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer");
  m.linear("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer");
  m.linear("time_text_embed.text_embedder.linear_1", "vector_in.in_layer");
  m.linear("time_text_embed.text_embedder.linear_2", "vector_in.out_layer");
  if (c.guidance_embeds) {
    m.linear("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer");
    m.linear("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer");
  }
  m.linear("context_embedder", "txt_in");
  m.linear("x_embedder", "img_in");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string to = "transformer_blocks." + std::to_string(i) + ".";
    const std::string from = "double_blocks." + std::to_string(i) + ".";
    m.linear(to + "norm1.linear", from + "img_mod.lin");
    m.linear(to + "norm1_context.linear", from + "txt_mod.lin");
    m.split(from + "img_attn.qkv", {{to + "attn.to_q", d}, {to + "attn.to_k", d}, {to + "attn.to_v", d}});
    m.split(from + "txt_attn.qkv",
            {{to + "attn.add_q_proj", d}, {to + "attn.add_k_proj", d}, {to + "attn.add_v_proj", d}});
    m.add(to + "attn.norm_q.weight", from + "img_attn.norm.query_norm.scale");
    m.add(to + "attn.norm_k.weight", from + "img_attn.norm.key_norm.scale");
    m.add(to + "attn.norm_added_q.weight", from + "txt_attn.norm.query_norm.scale");
    m.add(to + "attn.norm_added_k.weight", from + "txt_attn.norm.key_norm.scale");
    m.linear(to + "ff.net.0.proj", from + "img_mlp.0");
    m.linear(to + "ff.net.2", from + "img_mlp.2");
    m.linear(to + "ff_context.net.0.proj", from + "txt_mlp.0");
    m.linear(to + "ff_context.net.2", from + "txt_mlp.2");
    m.linear(to + "attn.to_out.0", from + "img_attn.proj");
    m.linear(to + "attn.to_add_out", from + "txt_attn.proj");
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    const std::string to = "single_transformer_blocks." + std::to_string(i) + ".";
    const std::string from = "single_blocks." + std::to_string(i) + ".";
    m.linear(to + "norm.linear", from + "modulation.lin");
    // linear1 is [q; k; v; mlp] with the MLP 4x wide (FLUX.1's mlp_ratio).
    m.split(from + "linear1",
            {{to + "attn.to_q", d}, {to + "attn.to_k", d}, {to + "attn.to_v", d}, {to + "proj_mlp", 4 * d}});
    m.add(to + "attn.norm_q.weight", from + "norm.query_norm.scale");
    m.add(to + "attn.norm_k.weight", from + "norm.key_norm.scale");
    m.linear(to + "proj_out", from + "linear2");
  }
  m.linear("proj_out", "final_layer.linear");
  // BFL's AdaLayerNormContinuous projects to (shift, scale); diffusers' to (scale, shift).
  m.add("norm_out.linear.weight", "final_layer.adaLN_modulation.1.weight", 0, -1, true);
  m.add("norm_out.linear.bias", "final_layer.adaLN_modulation.1.bias", 0, -1, true);
  return std::move(m.entries);
}

bool has_comfy_prefix(const nn::WeightSource& w) {
  for (const auto& n : w.names())
    if (n.rfind(kComfyPrefix, 0) == 0) return true;
  return false;
}

int64_t count_blocks(const nn::WeightSource& w, const std::string& prefix, const std::string& kind) {
  int64_t count = 0;
  for (const auto& n : w.names()) {
    if (n.rfind(prefix + kind, 0) != 0) continue;
    const std::string rest = n.substr(prefix.size() + kind.size());
    count = std::max<int64_t>(count, std::stoll(rest.substr(0, rest.find('.'))) + 1);
  }
  return count;
}

// Rows [begin, end) of `t` with the halves swapped when asked.
template <class T, class Rows, class Concat>
T select_rows(const T& t, const Entry& e, int64_t n0, Rows rows, Concat cat) {
  const int64_t end = e.end < 0 ? n0 : e.end;
  T r = rows(t, e.begin, end);
  if (!e.swap_halves) return r;
  const int64_t half = (end - e.begin) / 2;
  return cat(rows(r, half, end - e.begin), rows(r, 0, half));
}

}  // namespace

FluxSingleFileWeights::FluxSingleFileWeights(std::shared_ptr<const nn::WeightSource> inner,
                                             const FluxTransformerConfig& config)
    : inner_(std::move(inner)), prefix_(has_comfy_prefix(*inner_) ? kComfyPrefix : "") {
  entries_ = flux_mapping(config);
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::set<std::string> used;
  for (const auto& [to, e] : entries_) {
    const std::string from = prefix_ + e.source;
    KILN_CHECK(inner_->contains(from), inner_->description() << ": the FLUX single file lacks tensor '"
                                                             << from << "' (needed for " << to
                                                             << "; expected Black Forest Labs' layout)");
    if (e.end >= 0 || e.swap_halves) {
      const Shape s = inner_->shape(from);
      const int64_t need = e.end >= 0 ? e.end : 2;
      KILN_CHECK(!s.empty() && s[0] >= need && (!e.swap_halves || s[0] % 2 == 0),
                 inner_->description()
                     << ": tensor '" << from << "' has shape " << shape_str(s) << ", too few rows for " << to
                     << " (rows " << e.begin << " to " << need << ")");
    }
    used.insert(from);
  }
  // Whole fused tensors must be consumed exactly: a qkv with extra rows is a different architecture.
  for (const auto& [to, e] : entries_) {
    if (e.end < 0) continue;
    int64_t last = 0;
    for (const auto& [to2, e2] : entries_)
      if (e2.source == e.source) last = std::max(last, e2.end);
    const Shape s = inner_->shape(prefix_ + e.source);
    KILN_CHECK(s[0] == last, inner_->description() << ": tensor '" << prefix_ + e.source << "' has " << s[0]
                                                   << " rows but the config expects " << last);
  }
  for (const auto& n : inner_->names()) {
    if (used.count(n)) continue;
    // Other components of a ComfyUI checkpoint (VAE, text encoders) are not the transformer's business.
    if (!prefix_.empty() && n.rfind(prefix_, 0) != 0) continue;
    unmapped_.push_back(n);
  }
}

const Entry& FluxSingleFileWeights::entry(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const auto& e, const std::string& key) { return e.first < key; });
  KILN_CHECK(it != entries_.end() && it->first == name, description()
                                                            << ": no tensor maps to '" << name << "'");
  return it->second;
}

bool FluxSingleFileWeights::contains(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const auto& e, const std::string& key) { return e.first < key; });
  return it != entries_.end() && it->first == name;
}

Shape FluxSingleFileWeights::shape(const std::string& name) const {
  const Entry& e = entry(name);
  Shape s = inner_->shape(prefix_ + e.source);
  if (e.end >= 0) s[0] = e.end - e.begin;
  return s;
}

Tensor FluxSingleFileWeights::load(const std::string& name) const {
  const Entry& e = entry(name);
  const Tensor t = inner_->load(prefix_ + e.source);
  return select_rows(
      t, e, t.size(0), [](const Tensor& x, int64_t b, int64_t end) { return x.narrow(0, b, end - b); },
      [](const Tensor& a, const Tensor& b) {
        return concat({a, b}, 0);
      });
}

quant::QuantizedTensor FluxSingleFileWeights::load_quantized(const std::string& name) const {
  const Entry& e = entry(name);
  const quant::QuantizedTensor q = inner_->load_quantized(prefix_ + e.source);
  if (!q.defined()) return q;
  return select_rows(
      q, e, q.shape[0],
      [](const quant::QuantizedTensor& x, int64_t b, int64_t end) { return x.rows(b, end); },
      [](const quant::QuantizedTensor& a, const quant::QuantizedTensor& b) {
        Shape shape = a.shape;
        shape[0] += b.shape[0];
        return quant::QuantizedTensor{concat({a.blocks, b.blocks}, 0), a.type, shape};
      });
}

std::vector<std::string> FluxSingleFileWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [to, e] : entries_) out.push_back(to);
  out.insert(out.end(), unmapped_.begin(), unmapped_.end());
  return out;
}

std::string FluxSingleFileWeights::description() const {
  return inner_->description();
}

FluxTransformerConfig infer_flux_config(const nn::WeightSource& w) {
  const std::string p = has_comfy_prefix(w) ? kComfyPrefix : "";
  auto shape_of = [&](const std::string& name) {
    KILN_CHECK(w.contains(p + name),
               w.description() << ": not a FLUX transformer in Black Forest Labs' layout: no tensor '"
                               << p + name << "'");
    return w.shape(p + name);
  };
  FluxTransformerConfig c;
  const Shape img_in = shape_of("img_in.weight");
  KILN_CHECK(img_in.size() == 2, w.description()
                                     << ": img_in.weight should be 2-d, got " << shape_str(img_in));
  c.in_channels = img_in[1];
  c.out_channels = shape_of("final_layer.linear.weight")[0];
  c.joint_attention_dim = shape_of("txt_in.weight")[1];
  c.pooled_projection_dim = shape_of("vector_in.in_layer.weight")[1];
  c.num_layers = count_blocks(w, p, "double_blocks.");
  c.num_single_layers = count_blocks(w, p, "single_blocks.");
  c.guidance_embeds = w.contains(p + "guidance_in.in_layer.weight");
  const std::string norm = c.num_layers > 0 ? "double_blocks.0.img_attn.norm.query_norm.scale"
                                            : "single_blocks.0.norm.query_norm.scale";
  c.attention_head_dim = shape_of(norm)[0];
  KILN_CHECK(c.attention_head_dim > 0 && img_in[0] % c.attention_head_dim == 0,
             w.description() << ": img_in.weight " << shape_str(img_in) << " is not a whole number of "
                             << c.attention_head_dim << "-wide heads");
  c.num_attention_heads = img_in[0] / c.attention_head_dim;
  KILN_CHECK(c.attention_head_dim == 128,
             w.description() << ": heads of " << c.attention_head_dim
                             << " are not FLUX.1's 128, so the RoPE axes are unknown; pass the "
                                "transformer's config.json (--model or the config option)");
  c.validate(w.description());
  return c;
}

}  // namespace kiln::models
