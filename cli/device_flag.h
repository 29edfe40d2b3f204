// `kiln generate --device`: where the pipeline runs (cpu, or a PJRT device: xla-cpu, cuda, tpu, with :N for
// its index), and the flags that cannot go with a device yet.
#pragma once

#include <string>

#include "cli/execution_flags.h"
#include "kiln/core/device.h"

namespace kiln::cli {

// The device named by --device; throws naming the flag for a name no backend knows, and naming both flags
// when another flag asks for what runs on the cpu only (--offload sequential, --packed-weights).
// Loads no plugin.
Device parse_device_flag(const std::string& device, const ExecutionFlags& flags);

// Under tensor parallelism (one process per device), rank r's device: `device` itself on the cpu (the ranks
// share it), the device r places after it on a PJRT plugin (--device xla-cpu: rank 1 on xla-cpu:1).
Device device_of_rank(const Device& device, int rank);

// Reaches the device's runtime (its plugin loaded, its client made), so that a missing plugin fails before
// any weight is read, with the plugin locator's message (what to install).
void require_device(const Device& device);

}  // namespace kiln::cli
