// Topology descriptions and compiling without a device, over pjrt_c_api.h.
#ifdef KILN_HAVE_PJRT
#include "backends/pjrt/pjrt_topology.h"

#include <chrono>

#include "backends/pjrt/compile_options.h"
#include "backends/pjrt/mlir_signature.h"
#include "backends/pjrt/pjrt_errors.h"
#include "backends/pjrt/pjrt_internal.h"
#include "kiln/core/error.h"

namespace kiln::pjrt {

struct Topology::State {
  const PJRT_Api* api = nullptr;
  PJRT_TopologyDescription* topology = nullptr;
  std::string plugin_path, name, platform_name, device_kind;
  int device_count = 0;
};

std::shared_ptr<Topology> Topology::create(const std::string& plugin_path, const std::string& name,
                                           const std::vector<ClientOption>& options) {
  std::shared_ptr<Topology> t(new Topology());
  t->state_ = std::make_unique<State>();
  State& s = *t->state_;
  s.plugin_path = plugin_path;
  s.name = name;
  s.api = load_api(plugin_path);
  const PJRT_Api* api = s.api;
  KILN_CHECK(api->PJRT_TopologyDescription_Create && api->PJRT_Compile,
             "PJRT plugin " << plugin_path << " cannot compile without a device (it has no "
                            << "PJRT_TopologyDescription_Create or PJRT_Compile)");
  const std::vector<PJRT_NamedValue> named = named_values(options);
  KILN_PJRT_ARGS(PJRT_TopologyDescription_Create_Args, create);
  create.topology_name = name.data();
  create.topology_name_size = name.size();
  create.create_options = named.data();
  create.num_options = named.size();
  check(api, api->PJRT_TopologyDescription_Create(&create),
        ("PJRT_TopologyDescription_Create of '" + name + "' by " + plugin_path).c_str());
  s.topology = create.topology;

  KILN_PJRT_ARGS(PJRT_TopologyDescription_PlatformName_Args, platform);
  platform.topology = s.topology;
  check(api, api->PJRT_TopologyDescription_PlatformName(&platform), "PJRT_TopologyDescription_PlatformName");
  s.platform_name.assign(platform.platform_name, platform.platform_name_size);
  KILN_PJRT_ARGS(PJRT_TopologyDescription_GetDeviceDescriptions_Args, devices);
  devices.topology = s.topology;
  check(api, api->PJRT_TopologyDescription_GetDeviceDescriptions(&devices),
        "PJRT_TopologyDescription_GetDeviceDescriptions");
  s.device_count = int(devices.num_descriptions);
  KILN_CHECK(s.device_count > 0, "PJRT topology '" << name << "' of " << plugin_path << " has no devices");
  s.device_kind = description_kind(api, devices.descriptions[0]);
  return t;
}

Topology::~Topology() {
  if (!state_ || !state_->topology) return;
  KILN_PJRT_ARGS(PJRT_TopologyDescription_Destroy_Args, args);
  args.topology = state_->topology;
  discard(state_->api, state_->api->PJRT_TopologyDescription_Destroy(&args));
}

const std::string& Topology::platform_name() const {
  return state_->platform_name;
}
int Topology::device_count() const {
  return state_->device_count;
}
const std::string& Topology::device_kind() const {
  return state_->device_kind;
}

TargetProgram Topology::compile(std::string_view mlir_text, int num_replicas, int num_partitions) const {
  const State& s = *state_;
  KILN_CHECK(!mlir_text.empty(), "PJRT compile for " << s.name << ": the module text is empty");
  const size_t need = size_t(num_replicas) * size_t(num_partitions);
  KILN_CHECK(num_replicas >= 1 && num_partitions >= 1 && need <= size_t(s.device_count),
             "PJRT compile for " << s.name << ": " << num_replicas << " replicas x " << num_partitions
                                 << " partitions do not fit its " << s.device_count << " devices");
  main_parameters(mlir_text);  // the signature check Client::compile makes
  const auto start = std::chrono::steady_clock::now();
  const std::string options = compile_options_proto(num_replicas, num_partitions, need == 1);
  std::string code(mlir_text);
  const PJRT_Program program = mlir_program(code);
  const PJRT_Api* api = s.api;
  KILN_PJRT_ARGS(PJRT_Compile_Args, args);
  args.topology = s.topology;
  args.program = &program;
  args.compile_options = options.data();
  args.compile_options_size = options.size();
  check(api, api->PJRT_Compile(&args), ("PJRT_Compile for " + s.name).c_str());
  TargetProgram out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Unloaded exe(api, args.executable);
  if (const auto stats = compiled_memory_stats(api, exe.get())) {
    out.scratch_bytes = stats->temp_size_in_bytes;
    out.argument_bytes = stats->argument_size_in_bytes;
    out.output_bytes = stats->output_size_in_bytes;
    out.code_bytes = stats->generated_code_size_in_bytes;
  }
  KILN_PJRT_ARGS(PJRT_Executable_Serialize_Args, serialized);
  serialized.executable = exe.get();
  if (PJRT_Error* error = api->PJRT_Executable_Serialize(&serialized)) {
    discard(api, error);
  } else {
    out.serialized_bytes = serialized.serialized_bytes_size;
    if (serialized.serialized_executable_deleter)
      serialized.serialized_executable_deleter(serialized.serialized_executable);
  }
  return out;
}

}  // namespace kiln::pjrt
#endif  // KILN_HAVE_PJRT
