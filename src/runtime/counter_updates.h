// How the runtime bumps the counters in kiln/runtime/counters.h (relaxed atomics: they are statistics and
// order nothing).
#pragma once

namespace kiln::runtime {

void count_op_dispatched();
void count_kernel_launched();

}  // namespace kiln::runtime
