#include "backends/cpu/register_kernels.h"

namespace kiln::cpu_kernels {

void register_kernels(runtime::KernelRegistry& registry) {
  register_copy_kernels(registry);
  register_elementwise_kernels(registry);
  register_reduction_kernels(registry);
  register_layout_kernels(registry);
  register_matmul_kernels(registry);
  register_conv_kernels(registry);
  register_attention_kernels(registry);
  register_fused_kernels(registry);
  register_rope_table_kernels(registry);
  register_quantized_linear_kernels(registry);
  register_collective_kernels(registry);
}

}  // namespace kiln::cpu_kernels
