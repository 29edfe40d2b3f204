// Topology descriptions and compiling without a device, over pjrt_c_api.h.
#include <chrono>
#include <memory>
#include <utility>

#include "backends/pjrt/compile_options.h"
#include "backends/pjrt/mlir_signature.h"
#include "backends/pjrt/plugin/pjrt_errors.h"
#include "backends/pjrt/plugin/plugin.h"
#include "kiln/core/error.h"

namespace kiln::pjrt {

std::shared_ptr<Topology> create_plugin_topology(const std::string& plugin_path, const std::string& name,
                                                 const std::vector<ClientOption>& options) {
  TopologyDescription d;
  d.name = name;
  const PJRT_Api* api = load_api(plugin_path);
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
  // Destroyed here if describing it fails, else by the PluginTopology that takes it.
  const auto destroy = [api](PJRT_TopologyDescription* topology) {
    KILN_PJRT_ARGS(PJRT_TopologyDescription_Destroy_Args, args);
    args.topology = topology;
    discard(api, api->PJRT_TopologyDescription_Destroy(&args));
  };
  std::unique_ptr<PJRT_TopologyDescription, decltype(destroy)> owned(create.topology, destroy);

  KILN_PJRT_ARGS(PJRT_TopologyDescription_PlatformName_Args, platform);
  platform.topology = create.topology;
  check(api, api->PJRT_TopologyDescription_PlatformName(&platform), "PJRT_TopologyDescription_PlatformName");
  d.platform_name.assign(platform.platform_name, platform.platform_name_size);
  KILN_PJRT_ARGS(PJRT_TopologyDescription_GetDeviceDescriptions_Args, devices);
  devices.topology = create.topology;
  check(api, api->PJRT_TopologyDescription_GetDeviceDescriptions(&devices),
        "PJRT_TopologyDescription_GetDeviceDescriptions");
  d.device_count = int(devices.num_descriptions);
  KILN_CHECK(d.device_count > 0, "PJRT topology '" << name << "' of " << plugin_path << " has no devices");
  d.device_kind = description_kind(api, devices.descriptions[0]);
  return std::make_shared<PluginTopology>(api, owned.release(), std::move(d));
}

PluginTopology::PluginTopology(const PJRT_Api* api, PJRT_TopologyDescription* topology,
                               TopologyDescription description)
    : Topology(std::move(description)), api_(api), topology_(topology) {}

PluginTopology::~PluginTopology() {
  if (!topology_) return;
  KILN_PJRT_ARGS(PJRT_TopologyDescription_Destroy_Args, args);
  args.topology = topology_;
  discard(api_, api_->PJRT_TopologyDescription_Destroy(&args));
}

TargetProgram PluginTopology::compile(std::string_view mlir_text, int num_replicas, int num_partitions) const {
  const TopologyDescription& s = description();
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
  const PJRT_Api* api = api_;
  KILN_PJRT_ARGS(PJRT_Compile_Args, args);
  args.topology = topology_;
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
