// How the runtime bumps the counters in kiln/runtime/counters.h (relaxed atomics: they are statistics and
// order nothing).
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::runtime {

void count_op_dispatched();
void count_kernel_launched();
void count_fused_kernel_launched();
void count_bytes_moved(int64_t bytes);
// The bytes a kernel with these operands reads and writes (each tensor's size once).
int64_t operand_bytes(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs);
void count_graph_flush(int64_t ops_eliminated, int64_t ops_fused, int64_t chains_fused);
void count_graph_compiled();
void count_graph_cache_hit();
// The process-wide fused-kernel JIT's events (graph/cpu_jit.h).
void count_kernel_compiled();
void count_kernel_cache_memory_hit();
void count_kernel_cache_disk_hit();
void count_kernel_cache_disk_miss();

}  // namespace kiln::runtime
