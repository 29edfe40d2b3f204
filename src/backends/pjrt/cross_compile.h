// Compiling every program Kiln runs for other devices too: with KILN_PJRT_CROSS_COMPILE=tpu:v5e,cuda:h200
// (cross_targets.h names the targets), each distinct module a PJRT device compiles (an op of strict eager, a
// fused region, a compiled forward or block, a collective) is also lowered for each target's platform and
// compiled by that target's own compiler, without the device (pjrt_topology.h). So a host without a TPU or a
// GPU — CI, a laptop — finds out whether XLA's TPU and GPU compilers take everything a pipeline emits, and
// how much device memory each program needs there, by running the pipeline on the CPU plugin (xla-cpu).
//
// A module the target refuses stops the run with a kiln::Error naming the target, the program and the
// compiler's message. KILN_LOG=compile logs each cross-compile with its time and memory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backends/pjrt/stablehlo/lowering_target.h"
#include "kiln/runtime/cross_compile.h"

namespace kiln::pjrt {

// The module of one program, lowered for a target (the text differs only where the target changes what is
// emitted: cuDNN attention on cuda).
using LowerFor = std::function<std::string(const hlo::LoweringTarget&)>;

// The targets KILN_PJRT_CROSS_COMPILE names (comma-separated, spaces ignored), read at each call; empty when
// unset.
std::vector<std::string> cross_compile_targets();

// Compiles the program for every target of cross_compile_targets(), once per distinct text and target.
// `own_platform` is the running device's and `own_text` its module; `lower_for` re-lowers for a target whose
// lowering differs (empty: the text is the same everywhere, as a collective's). `what` names the program.
void cross_compile(const std::string& own_platform, const std::string& own_text, const LowerFor& lower_for,
                   int num_replicas, const std::string& what);

// What was compiled per target: kiln::cross_compile_summary() (kiln/runtime/cross_compile.h).

}  // namespace kiln::pjrt
