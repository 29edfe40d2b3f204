// The module of one collective op among in-process ranks (kiln/dist/local_ranks.h): compiled for as many
// replicas as ranks, one replica per rank's device, and run once for all of them, so the reduction or the
// gather happens between the devices inside the executable (XLA's all-reduce / all-gather: NCCL on GPUs, the
// interconnect on TPUs, shared memory on the CPU plugin).
//
// @main takes the input's storage as a flat array (storage_views.h) and returns the output's. all_reduce_sum
// adds in float32 and rounds once, as the host collectives do for bfloat16 and float16.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/op_call.h"

namespace kiln::pjrt::hlo {

// Throws a kiln::Error naming the op when it is not all_reduce_sum or all_gather.
std::string collective_module(const runtime::OpCall& call, int64_t replicas);

}  // namespace kiln::pjrt::hlo
