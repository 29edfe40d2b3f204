// diffusers' enable_model_cpu_offload, as a host without an accelerator does it: once a component has run,
// its weights are released (Module::release_weights: packed copies freed, checkpoint file pages handed back,
// page cache included), so the memory goes to the component that runs next; the next call reads them again
// from the file.
#pragma once

#include <initializer_list>
#include <utility>

#include "kiln/nn/module.h"
#include "kiln/pipelines/offload.h"

namespace kiln::pipelines {

// Releases each (name, module) that ran; says what was released under KILN_LOG=offload.
void release_after_use(std::initializer_list<std::pair<const char*, nn::Module*>> components);

// Sets the process-wide budgets a plan needs (packed copies, resident mapped weights); returns whether the
// pipeline must also release each component after use.
bool apply_offload(const OffloadPlan& plan);

}  // namespace kiln::pipelines
