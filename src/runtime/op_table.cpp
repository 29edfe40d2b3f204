#include "runtime/op_table.h"

namespace kiln::runtime {

const std::vector<OpInfo>& op_table() {
  static const std::vector<OpInfo> table{
      // data movement (between devices too)
      {"copy"},
      // elementwise (ops/elementwise.h)
      {"add"},
      {"sub"},
      {"mul"},
      {"div"},
      {"maximum"},
      {"minimum"},
      {"pow"},
      {"eq"},
      {"ne"},
      {"lt"},
      {"le"},
      {"gt"},
      {"ge"},
      {"where"},
      {"neg"},
      {"abs"},
      {"exp"},
      {"log"},
      {"sqrt"},
      {"rsqrt"},
      {"sin"},
      {"cos"},
      {"tanh"},
      {"sigmoid"},
      {"silu"},
      {"gelu"},
      {"gelu_tanh"},
      {"quick_gelu"},
      {"square"},
      {"clamp"},
      {"pow_scalar"},
      // reductions and normalisations (ops/reduction.h, ops/nn.h)
      {"sum"},
      {"mean"},
      {"max"},
      {"var"},
      {"softmax"},
      {"layer_norm"},
      {"rms_norm"},
      {"group_norm"},
      // layout (ops/layout.h)
      {"concat"},
      {"embedding"},
      {"upsample_nearest2d"},
      {"rope"},
      {"flux_rope_tables"},
      // products (ops/linalg.h, ops/attention.h, ops/quantized_linear.h)
      {"linear"},
      {"matmul"},
      {"conv2d"},
      {"scaled_dot_product_attention"},
      {"linear_quantized"},
      // what the graph passes make of several ops (ops/fused.h)
      {"linear_fused"},
      {"norm_modulate"},
      // collectives (ops/collective.h)
      {"all_reduce_sum", false},
      {"all_gather", false},
  };
  return table;
}

const OpInfo* find_op(std::string_view name) {
  for (const OpInfo& op : op_table())
    if (op.name == name) return &op;
  return nullptr;
}

}  // namespace kiln::runtime
