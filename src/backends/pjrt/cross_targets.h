// The devices Kiln can compile for without having them (pjrt_topology.h): TPU generations through libtpu and
// NVIDIA GPUs through the CUDA plugin, by name:
//   tpu:v4, tpu:v5e, tpu:v5p, tpu:v6e   a 4-chip slice of that generation (tpu:v5e:2x4 names another shape)
//   cuda:h200, cuda:h100, cuda:a100, cuda:l4, cuda:rtx4090   4 such GPUs on one host (cuda:h100:8: eight)
// A target's plugin is looked for in Kiln's cache (<cache>/pjrt/cross/, where `scripts/fetch_pjrt.sh
// --cross` puts libtpu and the CUDA plugin) and then where pip installs it (plugin_locator.h); the CUDA
// plugin also needs the CUDA toolkit's ptxas and libdevice (/usr/local/cuda, or
// XLA_FLAGS=--xla_gpu_cuda_data_dir=DIR).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/pjrt/pjrt_topology.h"

namespace kiln::pjrt {

struct CrossTarget {
  std::string name;      // as asked: "tpu:v5e", "cuda:h200"
  std::string platform;  // the plugin's platform: "tpu", "cuda"
  std::shared_ptr<Topology> topology;
};

// The names above, for messages and `kiln info`.
std::vector<std::string> known_cross_targets();

// The plugin file a target of `platform` ("tpu" or "cuda") compiles with; throws naming every place looked in
// and how to get it.
std::string find_cross_plugin(const std::string& platform);

// The target `name` (created once per process and name). Throws for an unknown name (listing the known ones),
// a missing plugin, or the plugin's refusal.
CrossTarget cross_target(const std::string& name);

}  // namespace kiln::pjrt
