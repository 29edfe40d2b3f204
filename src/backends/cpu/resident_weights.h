// The budget on weights read in place from memory-mapped checkpoints (kiln::set_resident_weight_budget): the
// kernels report each such weight before reading it, and the least recently used ones beyond the budget leave
// the process (their pages stay in the page cache, from which the next use maps them back without a disk
// read).
#pragma once

#include "kiln/core/tensor.h"

namespace kiln::cpu_kernels {

// Marks `weight` as about to be read in place (group offloading hears of it: kiln/runtime/weight_groups.h).
// With a budget set and `weight` on file pages, it becomes the most recently used weight and the least
// recently used others are released until the rest fit.
void use_resident_weight(const Tensor& weight);

}  // namespace kiln::cpu_kernels
