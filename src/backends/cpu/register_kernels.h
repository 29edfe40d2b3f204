// Every CPU kernel group registers itself here; the CPU backend (cpu_runtime.cpp) calls register_kernels
// once.
#pragma once

#include "runtime/dispatcher.h"

namespace kiln::cpu_kernels {

void register_kernels(runtime::KernelRegistry& registry);

void register_copy_kernels(runtime::KernelRegistry& registry);         // copy.cpp: strided copy and cast
void register_elementwise_kernels(runtime::KernelRegistry& registry);  // elementwise.cpp
void register_reduction_kernels(runtime::KernelRegistry& registry);  // reduction.cpp: reduce, softmax, norms
void register_layout_kernels(runtime::KernelRegistry& registry);  // layout.cpp: concat, rope, embedding, ...
void register_matmul_kernels(runtime::KernelRegistry& registry);  // matmul.cpp (oneDNN)
void register_conv_kernels(runtime::KernelRegistry& registry);    // conv.cpp (oneDNN)
void register_attention_kernels(runtime::KernelRegistry& registry);   // attention.cpp
void register_rope_table_kernels(runtime::KernelRegistry& registry);  // rope_tables.cpp: FLUX RoPE tables
void register_fused_kernels(runtime::KernelRegistry& registry);  // fused_*.cpp: linear_fused, norm_modulate
void register_quantized_linear_kernels(runtime::KernelRegistry& registry);  // quantized_linear.cpp (GGUF)
void register_collective_kernels(
    runtime::KernelRegistry& registry);  // collective.cpp: all-reduce, all-gather

}  // namespace kiln::cpu_kernels
