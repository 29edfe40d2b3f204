// Compiled mode: Module::compile traces a module's forward for the input shapes it is called with into one
// optimised program (fused chains and elementwise kernels, a static memory plan; graph/program.h) and reuses
// it for every later call with the same input shapes and dtypes. A new shape compiles once more; changing
// anything that is not a shape (the timestep, the sigmas, the number of steps) never recompiles. Fused
// kernels persist in the on-disk cache (KILN_CACHE_DIR, default ~/.cache/kiln), so a second process builds
// none; the program itself is re-traced per process (the op front ends only: milliseconds).
// Module::compile_repeated_blocks compiles each distinct repeated block once and shares the program between
// all its instances, their weights bound as inputs.
// On a PJRT device (module.to("cuda"), "tpu", "xla-cpu") the traced forward is one StableHLO module, one
// executable per input shape (and per block class), which persists in the same cache folder
// (pjrt-executables/), so a second process compiles none either.
#pragma once

namespace kiln::nn {

struct CompileOptions {
  // true: a forward that breaks the graph (reads tensor values on the host) is an error naming the op.
  // false: such a forward runs eagerly for those shapes, after one warning.
  bool fullgraph = true;
  // Shape-polymorphic programs are not supported: true is rejected (each new shape compiles once instead).
  bool dynamic = false;
};

}  // namespace kiln::nn
