#include "kiln/models/sd3_single_file.h"

#include "kiln/nn/mapped_weights.h"

namespace kiln::models {

namespace {

nn::MappedWeights::Mapping sd3_mapping(const SD3TransformerConfig& c) {
  const int64_t d = c.inner_dim();
  const bool qk_norm = !c.qk_norm.empty();
  nn::MappingBuilder m;
  m.add("pos_embed.pos_embed", "pos_embed");
  m.linear("pos_embed.proj", "x_embedder.proj");
  m.linear("time_text_embed.timestep_embedder.linear_1", "t_embedder.mlp.0");
  m.linear("time_text_embed.timestep_embedder.linear_2", "t_embedder.mlp.2");
  m.linear("time_text_embed.text_embedder.linear_1", "y_embedder.mlp.0");
  m.linear("time_text_embed.text_embedder.linear_2", "y_embedder.mlp.2");
  m.linear("context_embedder", "context_embedder");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string to = "transformer_blocks." + std::to_string(i) + ".";
    const std::string x = "joint_blocks." + std::to_string(i) + ".x_block.";
    const std::string ctx = "joint_blocks." + std::to_string(i) + ".context_block.";
    // The last block's context stream only feeds the image stream's attention ("pre-only"): no output
    // projection, no MLP, and its norm is a continuous adaLN whose projection is (shift, scale) in SAI's
    // files.
    const bool last = i == c.num_layers - 1;
    m.split(x + "attn.qkv", {{to + "attn.to_q", d}, {to + "attn.to_k", d}, {to + "attn.to_v", d}});
    m.split(ctx + "attn.qkv",
            {{to + "attn.add_q_proj", d}, {to + "attn.add_k_proj", d}, {to + "attn.add_v_proj", d}});
    if (qk_norm) {
      m.add(to + "attn.norm_q.weight", x + "attn.ln_q.weight");
      m.add(to + "attn.norm_k.weight", x + "attn.ln_k.weight");
      m.add(to + "attn.norm_added_q.weight", ctx + "attn.ln_q.weight");
      m.add(to + "attn.norm_added_k.weight", ctx + "attn.ln_k.weight");
    }
    m.linear(to + "attn.to_out.0", x + "attn.proj");
    if (!last) m.linear(to + "attn.to_add_out", ctx + "attn.proj");
    if (c.is_dual_attention_layer(i)) {
      m.split(x + "attn2.qkv", {{to + "attn2.to_q", d}, {to + "attn2.to_k", d}, {to + "attn2.to_v", d}});
      if (qk_norm) {
        m.add(to + "attn2.norm_q.weight", x + "attn2.ln_q.weight");
        m.add(to + "attn2.norm_k.weight", x + "attn2.ln_k.weight");
      }
      m.linear(to + "attn2.to_out.0", x + "attn2.proj");
    }
    m.linear(to + "norm1.linear", x + "adaLN_modulation.1");
    if (last)
      m.swapped(to + "norm1_context.linear", ctx + "adaLN_modulation.1");
    else
      m.linear(to + "norm1_context.linear", ctx + "adaLN_modulation.1");
    m.linear(to + "ff.net.0.proj", x + "mlp.fc1");
    m.linear(to + "ff.net.2", x + "mlp.fc2");
    if (!last) {
      m.linear(to + "ff_context.net.0.proj", ctx + "mlp.fc1");
      m.linear(to + "ff_context.net.2", ctx + "mlp.fc2");
    }
  }
  m.linear("proj_out", "final_layer.linear");
  m.swapped("norm_out.linear", "final_layer.adaLN_modulation.1");
  return std::move(m.entries);
}

}  // namespace

std::unique_ptr<nn::WeightSource> sd3_single_file_weights(std::shared_ptr<const nn::WeightSource> inner,
                                                          const SD3TransformerConfig& config) {
  std::string prefix = nn::MappedWeights::prefix_if_present(*inner, "model.diffusion_model.");
  return std::make_unique<nn::MappedWeights>(std::move(inner), sd3_mapping(config), std::move(prefix),
                                             "SD3 single file (Stability AI's layout)");
}

}  // namespace kiln::models
