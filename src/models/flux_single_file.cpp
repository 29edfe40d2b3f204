#include "kiln/models/flux_single_file.h"

#include <algorithm>

#include "kiln/nn/mapped_weights.h"

namespace kiln::models {

namespace {

constexpr const char* kComfyPrefix = "model.diffusion_model.";

nn::MappedWeights::Mapping flux_mapping(const FluxTransformerConfig& c) {
  nn::MappingBuilder m;
  m.linear("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer");
  m.linear("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer");
  m.linear("time_text_embed.text_embedder.linear_1", "vector_in.in_layer");
  m.linear("time_text_embed.text_embedder.linear_2", "vector_in.out_layer");
  if (c.guidance_embeds) {
    m.linear("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer");
    m.linear("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer");
  }
  add_flux_backbone_renames(m, c.inner_dim(), c.num_layers, c.num_single_layers);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string to = "transformer_blocks." + std::to_string(i) + ".";
    const std::string from = "double_blocks." + std::to_string(i) + ".";
    m.linear(to + "norm1.linear", from + "img_mod.lin");
    m.linear(to + "norm1_context.linear", from + "txt_mod.lin");
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i)
    m.linear("single_transformer_blocks." + std::to_string(i) + ".norm.linear",
             "single_blocks." + std::to_string(i) + ".modulation.lin");
  // BFL's AdaLayerNormContinuous projects to (shift, scale); diffusers' to (scale, shift).
  m.swapped("norm_out.linear", "final_layer.adaLN_modulation.1");
  return std::move(m.entries);
}

}  // namespace

void add_flux_backbone_renames(nn::MappingBuilder& m, int64_t d, int64_t double_blocks,
                               int64_t single_blocks) {
  m.linear("context_embedder", "txt_in");
  m.linear("x_embedder", "img_in");
  for (int64_t i = 0; i < double_blocks; ++i) {
    const std::string to = "transformer_blocks." + std::to_string(i) + ".";
    const std::string from = "double_blocks." + std::to_string(i) + ".";
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
  for (int64_t i = 0; i < single_blocks; ++i) {
    const std::string to = "single_transformer_blocks." + std::to_string(i) + ".";
    const std::string from = "single_blocks." + std::to_string(i) + ".";
    // linear1 is [q; k; v; mlp] with the MLP 4x wide (FLUX.1's mlp_ratio).
    m.split(from + "linear1",
            {{to + "attn.to_q", d}, {to + "attn.to_k", d}, {to + "attn.to_v", d}, {to + "proj_mlp", 4 * d}});
    m.add(to + "attn.norm_q.weight", from + "norm.query_norm.scale");
    m.add(to + "attn.norm_k.weight", from + "norm.key_norm.scale");
    m.linear(to + "proj_out", from + "linear2");
  }
  m.linear("proj_out", "final_layer.linear");
}

lora::OriginalLayout flux_backbone_lora_layout() {
  lora::OriginalLayout layout;
  layout.block(lora::kDoubleBlocks, "transformer_blocks") = {
      {"img_attn.qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}},
      {"txt_attn.qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
      {"img_attn.proj", {"attn.to_out.0"}},
      {"txt_attn.proj", {"attn.to_add_out"}},
      {"img_mlp.0", {"ff.net.0.proj"}},
      {"img_mlp.2", {"ff.net.2"}},
      {"txt_mlp.0", {"ff_context.net.0.proj"}},
      {"txt_mlp.2", {"ff_context.net.2"}},
  };
  // linear1 is [q | k | v | mlp], which diffusers keeps as four layers.
  layout.block(lora::kSingleBlocks, "single_transformer_blocks") = {
      {"linear1", {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"}},
      {"linear2", {"proj_out"}},
  };
  layout.top_level = {
      {"img_in", {"x_embedder"}},
      {"txt_in", {"context_embedder"}},
      {"final_layer.linear", {"proj_out"}},
  };
  return layout;
}

int64_t count_single_file_blocks(const nn::WeightSource& w, const std::string& prefix,
                                 const std::string& kind) {
  int64_t count = 0;
  for (const auto& n : w.names()) {
    if (n.rfind(prefix + kind, 0) != 0) continue;
    const std::string rest = n.substr(prefix.size() + kind.size());
    count = std::max<int64_t>(count, std::stoll(rest.substr(0, rest.find('.'))) + 1);
  }
  return count;
}

std::unique_ptr<nn::WeightSource> flux_single_file_weights(std::shared_ptr<const nn::WeightSource> inner,
                                                           const FluxTransformerConfig& config) {
  std::string prefix = nn::MappedWeights::prefix_if_present(*inner, kComfyPrefix);
  return std::make_unique<nn::MappedWeights>(std::move(inner), flux_mapping(config), std::move(prefix),
                                             "FLUX single file (Black Forest Labs' layout)");
}

FluxTransformerConfig infer_flux_config(const nn::WeightSource& w) {
  const std::string p = nn::MappedWeights::prefix_if_present(w, kComfyPrefix);
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
  c.num_layers = count_single_file_blocks(w, p, "double_blocks.");
  c.num_single_layers = count_single_file_blocks(w, p, "single_blocks.");
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
