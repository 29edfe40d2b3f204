// The module of one collective op among in-process ranks (kiln/dist/local_ranks.h): compiled for as many
// replicas as ranks, one replica per rank's device, and run once for all of them, so the reduction or the
// gather happens between the devices inside the executable (XLA's all-reduce / all-gather: NCCL on GPUs, the
// interconnect on TPUs, shared memory on the CPU plugin).
//
// @main takes the input's storage as its array (storage_views.h) and returns the output's. all_reduce_sum
// adds in float32 and rounds once, as the host collectives do for bfloat16 and float16.
#pragma once

#include <cstdint>
#include <string>

#include "backends/pjrt/stablehlo/storage_views.h"
#include "runtime/op_call.h"

namespace kiln::pjrt::hlo {

// Throws a kiln::Error naming the op when it is not all_reduce_sum or all_gather.
// The input is read as an array of `array_dims` (flat when not given).
std::string collective_module(const runtime::OpCall& call, int64_t replicas,
                              const ArrayDims& array_dims = flat_array_dims);

}  // namespace kiln::pjrt::hlo
