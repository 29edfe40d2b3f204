// What compiling for devices Kiln does not have found (KILN_PJRT_CROSS_COMPILE=tpu:v5e,cuda:h200; see
// docs/devices.md): while a pipeline runs on a PJRT device (the CPU plugin, xla-cpu, on a host without
// accelerators), every distinct program it compiles is also compiled by each named target's own compiler,
// without the device. A program a target refuses stops the run with an error naming both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

struct CrossCompileSummary {
  std::string target;                 // "tpu:v5e", "cuda:h200"
  std::string device_kind;            // as the target's compiler names it: "TPU v5 lite", "NVIDIA H200"
  int64_t programs = 0;               // distinct programs compiled for it
  double seconds = 0;                 // their compile time
  int64_t largest_scratch_bytes = 0;  // the most temporary device memory one program needs there
  std::string largest_scratch_program;
  int64_t largest_program_bytes = 0;  // the most device memory one run needs: arguments, outputs and scratch
  std::string largest_program;
};

// Per target, in the order first used; empty when nothing was cross-compiled.
std::vector<CrossCompileSummary> cross_compile_summary();
// The targets of each platform Kiln can compile for, and the plugin that would compile them (or why none is
// found), as `kiln info --devices` lists them.
struct CrossCompilePlatform {
  std::string platform;              // "tpu", "cuda"
  std::vector<std::string> targets;  // "tpu:v5e", ...
  std::string plugin;                // its path; empty when none is found
  std::string missing;               // then: why (where it was looked for, how to get it)
};
std::vector<CrossCompilePlatform> cross_compile_platforms();

// Forgets the counts and which programs were compiled (the next run compiles them for the targets again).
void reset_cross_compile_summary();

}  // namespace kiln
