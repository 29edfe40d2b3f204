// The PJRT backend's region runner (runtime::Backend::joins_region / run_region): a region of calls on one
// PJRT device — a deferred graph's flush or a traced forward — runs as ONE executable built from
// hlo::region_module, compiled once per distinct module text (executable_cache.h) and launched once.
#pragma once

#include "runtime/device_region.h"

namespace kiln::pjrt {

// Whether `call` can be lowered inside a region: every operand on its output's PJRT device (a copy between
// devices moves bytes through the host and runs alone) and an op with a lowering.
bool joins_pjrt_region(const runtime::OpCall& call);

void run_pjrt_region(const runtime::DeviceRegion& region);

}  // namespace kiln::pjrt
