#include "families/chroma/chroma_single_file.h"

#include <string>

#include "kiln/models/flux_single_file.h"
#include "kiln/nn/mapped_weights.h"

namespace kiln::models {

namespace {

constexpr const char* kComfyPrefix = "model.diffusion_model.";
constexpr const char* kApproximator = "distilled_guidance_layer.";

nn::MappedWeights::Mapping chroma_mapping(const ChromaTransformerConfig& c) {
  nn::MappingBuilder m;
  add_flux_backbone_renames(m, c.inner_dim(), c.num_layers, c.num_single_layers);
  const std::string a = kApproximator;
  m.linear(a + "in_proj", a + "in_proj");
  m.linear(a + "out_proj", a + "out_proj");
  for (int64_t i = 0; i < c.approximator_layers; ++i) {
    const std::string layer = a + "layers." + std::to_string(i) + ".";
    m.linear(layer + "linear_1", layer + "in_layer");
    m.linear(layer + "linear_2", layer + "out_layer");
    m.add(a + "norms." + std::to_string(i) + ".weight", a + "norms." + std::to_string(i) + ".scale");
  }
  return std::move(m.entries);
}

int64_t count_approximator_layers(const nn::WeightSource& w, const std::string& prefix) {
  int64_t count = 0;
  while (w.contains(prefix + kApproximator + "layers." + std::to_string(count) + ".in_layer.weight")) ++count;
  return count;
}

}  // namespace

bool is_chroma_single_file(const nn::WeightSource& w) {
  const std::string p = nn::MappedWeights::prefix_if_present(w, kComfyPrefix);
  return w.contains(p + kApproximator + "in_proj.bias");
}

std::unique_ptr<nn::WeightSource> chroma_single_file_weights(std::shared_ptr<const nn::WeightSource> inner,
                                                             const ChromaTransformerConfig& config) {
  std::string prefix = nn::MappedWeights::prefix_if_present(*inner, kComfyPrefix);
  return std::make_unique<nn::MappedWeights>(std::move(inner), chroma_mapping(config), std::move(prefix),
                                             "Chroma single file (the original layout)");
}

ChromaTransformerConfig infer_chroma_config(const nn::WeightSource& w) {
  const std::string p = nn::MappedWeights::prefix_if_present(w, kComfyPrefix);
  KILN_CHECK(is_chroma_single_file(w), w.description()
                                           << ": not a Chroma transformer in the original layout: no "
                                              "tensor '"
                                           << p << kApproximator << "in_proj.bias'");
  auto shape_of = [&](const std::string& name) {
    KILN_CHECK(w.contains(p + name), w.description()
                                         << ": not a Chroma transformer in the original layout: no "
                                            "tensor '"
                                         << p + name << "'");
    const Shape shape = w.shape(p + name);
    KILN_CHECK(shape.size() == 2 || name.find(".scale") != std::string::npos,
               w.description() << ": " << p + name << " should be 2-d, got " << shape_str(shape));
    return shape;
  };
  ChromaTransformerConfig c;
  const Shape img_in = shape_of("img_in.weight");
  c.in_channels = img_in[1];
  c.out_channels = shape_of("final_layer.linear.weight")[0];
  c.joint_attention_dim = shape_of("txt_in.weight")[1];
  c.num_layers = count_single_file_blocks(w, p, "double_blocks.");
  c.num_single_layers = count_single_file_blocks(w, p, "single_blocks.");
  const Shape in_proj = shape_of(std::string(kApproximator) + "in_proj.weight");
  c.approximator_hidden_dim = in_proj[0];
  c.approximator_num_channels = in_proj[1];
  c.approximator_layers = count_approximator_layers(w, p);
  const std::string norm = c.num_layers > 0 ? "double_blocks.0.img_attn.norm.query_norm.scale"
                                            : "single_blocks.0.norm.query_norm.scale";
  c.attention_head_dim = shape_of(norm)[0];
  KILN_CHECK(c.attention_head_dim > 0 && img_in[0] % c.attention_head_dim == 0,
             w.description() << ": img_in.weight " << shape_str(img_in) << " is not a whole number of "
                             << c.attention_head_dim << "-wide heads");
  c.num_attention_heads = img_in[0] / c.attention_head_dim;
  KILN_CHECK(c.attention_head_dim == 128,
             w.description() << ": heads of " << c.attention_head_dim
                             << " are not Chroma's 128, so the RoPE axes are unknown; pass the transformer's "
                                "config.json (a diffusers folder beside the file)");
  c.validate(w.description());
  return c;
}

}  // namespace kiln::models
