// Compiling for devices this host does not have: a PJRT topology description
// (PJRT_TopologyDescription_Create) stands for a TPU slice or an NVIDIA GPU, and PJRT_Compile builds
// executables for it with the plugin's real compiler and no device. libtpu takes a topology name ("v5e:2x2");
// the CUDA plugin takes a GPU's description (a GpuTargetConfigProto in text form, option "target_config") and
// a shape (option "topology", "1x1x4"), and runs its whole pipeline down to ptxas for that GPU. What comes
// out cannot run here; what it tells is whether the target's compiler takes a module, and how much device
// memory each run needs (the compiled memory stats). Used by cross_compile.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/pjrt/client_options.h"

namespace kiln::pjrt {

// What the target's compiler reports of one executable (PJRT_Executable_GetCompiledMemoryStats; -1 where
// the plugin reports nothing).
struct TargetProgram {
  int64_t scratch_bytes = -1;   // temporary buffers of one run
  int64_t argument_bytes = -1;  // the parameters' buffers
  int64_t output_bytes = -1;    // the results' buffers
  int64_t code_bytes = -1;      // generated code
  size_t serialized_bytes = 0;  // PJRT_Executable_Serialize's bytes
  double seconds = 0;           // compile time
};

// What a topology says of itself once described.
struct TopologyDescription {
  std::string name;           // as given ("v5e:2x2")
  std::string platform_name;  // "tpu", "cuda"
  int device_count = 0;
  std::string device_kind;  // the first device's kind ("TPU v5 lite", "NVIDIA H200")
};

// As Client (pjrt_client.h): what Kiln knows here, the plugin's work virtual and implemented in plugin/.
class Topology {
 public:
  // Loads the plugin at `plugin_path` (once per process, as Client::create does) and describes `name` with
  // `options`. Errors name the plugin and carry its message; in a build without PJRT support, says how to get
  // it.
  static std::shared_ptr<Topology> create(const std::string& plugin_path, const std::string& name,
                                          const std::vector<ClientOption>& options = {});
  virtual ~Topology() = default;
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  const std::string& platform_name() const { return description_.platform_name; }
  int device_count() const { return description_.device_count; }
  const std::string& device_kind() const { return description_.device_kind; }

  // Compiles StableHLO text for `num_replicas` x `num_partitions` of the topology's devices (the module is
  // checked as Client::compile checks it). Throws a kiln::Error carrying the compiler's message.
  virtual TargetProgram compile(std::string_view mlir_text, int num_replicas = 1,
                                int num_partitions = 1) const = 0;

 protected:
  explicit Topology(TopologyDescription description) : description_(std::move(description)) {}
  const TopologyDescription& description() const { return description_; }

 private:
  TopologyDescription description_;
};

}  // namespace kiln::pjrt
