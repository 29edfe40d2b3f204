// Compiling, (de)serializing and running executables over pjrt_c_api.h.
#include <sstream>

#include "backends/pjrt/compile_options.h"
#include "backends/pjrt/mlir_signature.h"
#include "backends/pjrt/plugin/pjrt_dtypes.h"
#include "backends/pjrt/plugin/pjrt_errors.h"
#include "backends/pjrt/plugin/plugin.h"
#include "kiln/core/error.h"

namespace kiln::pjrt {
namespace {

// The first line of serialize()'s bytes: a magic word and the parameters as MLIR tensor types.
constexpr std::string_view kMagic = "kiln-pjrt-executable-1";

std::string tensor_type(const ArraySpec& spec) {
  static constexpr std::pair<DType, const char*> kNames[] = {
      {DType::Float32, "f32"}, {DType::BFloat16, "bf16"}, {DType::Float16, "f16"}, {DType::Float64, "f64"},
      {DType::Int64, "i64"},   {DType::Int32, "i32"},     {DType::Int16, "i16"},   {DType::Int8, "i8"},
      {DType::UInt8, "ui8"},   {DType::Bool, "i1"}};
  std::string out = "tensor<";
  for (int64_t d : spec.dims) out += std::to_string(d) + "x";
  for (const auto& [d, n] : kNames)
    if (d == spec.dtype) out += n;
  return out + ">";
}

// The temporary device memory a run of `exe` needs, when the plugin reports it.
std::optional<int64_t> scratch_bytes_of(const PJRT_Api* api, PJRT_Executable* exe) {
  const auto stats = compiled_memory_stats(api, exe);
  if (!stats || stats->temp_size_in_bytes < 0) return std::nullopt;
  return stats->temp_size_in_bytes;
}

// What the plugin knows about a freshly loaded executable: replica/partition counts, outputs, devices,
// scratch; beside the parameters Kiln read from its module.
ExecutableLayout describe(const Plugin& plugin, PJRT_LoadedExecutable* loaded, std::vector<ArraySpec> parameters) {
  const PJRT_Api* api = plugin.api;
  ExecutableLayout layout;
  layout.parameters = std::move(parameters);
  Unloaded exe(api, loaded);
  KILN_PJRT_ARGS(PJRT_Executable_NumReplicas_Args, replicas);
  replicas.executable = exe.get();
  check(api, api->PJRT_Executable_NumReplicas(&replicas), "PJRT_Executable_NumReplicas");
  layout.num_replicas = int(replicas.num_replicas);
  KILN_PJRT_ARGS(PJRT_Executable_NumPartitions_Args, partitions);
  partitions.executable = exe.get();
  check(api, api->PJRT_Executable_NumPartitions(&partitions), "PJRT_Executable_NumPartitions");
  layout.num_partitions = int(partitions.num_partitions);
  layout.scratch_bytes = scratch_bytes_of(api, exe.get());

  KILN_PJRT_ARGS(PJRT_Executable_NumOutputs_Args, count);
  count.executable = exe.get();
  check(api, api->PJRT_Executable_NumOutputs(&count), "PJRT_Executable_NumOutputs");
  KILN_PJRT_ARGS(PJRT_Executable_OutputElementTypes_Args, types);
  types.executable = exe.get();
  check(api, api->PJRT_Executable_OutputElementTypes(&types), "PJRT_Executable_OutputElementTypes");
  KILN_PJRT_ARGS(PJRT_Executable_OutputDimensions_Args, dims);
  dims.executable = exe.get();
  check(api, api->PJRT_Executable_OutputDimensions(&dims), "PJRT_Executable_OutputDimensions");
  KILN_CHECK(types.num_output_types == count.num_outputs && dims.num_outputs == count.num_outputs,
             "PJRT executable: the plugin reports " << count.num_outputs << " outputs, but "
                                                    << types.num_output_types << " types and "
                                                    << dims.num_outputs << " shapes");
  const int64_t* d = dims.dims;
  for (size_t i = 0; i < count.num_outputs; ++i) {
    ArraySpec spec;
    spec.dtype = from_pjrt(types.output_types[i], "PJRT executable output");
    spec.dims.assign(d, d + dims.dim_sizes[i]);
    d += dims.dim_sizes[i];
    layout.outputs.push_back(std::move(spec));
  }

  KILN_PJRT_ARGS(PJRT_LoadedExecutable_AddressableDevices_Args, devices);
  devices.executable = loaded;
  check(api, api->PJRT_LoadedExecutable_AddressableDevices(&devices),
        "PJRT_LoadedExecutable_AddressableDevices");
  // A portable executable (1 x 1, no device assignment) has no devices of its own: it runs where it is sent.
  const bool portable = layout.num_replicas == 1 && layout.num_partitions == 1;
  if (!portable) {
    for (size_t i = 0; i < devices.num_addressable_devices; ++i) {
      const int index = plugin.index_of(devices.addressable_devices[i]);
      KILN_CHECK(index >= 0,
                 "PJRT executable: runs on a device that is not one of the client's addressable devices");
      layout.device_indices.push_back(index);
    }
  }
  return layout;
}

}  // namespace

// ---- Unloaded, memory stats

Unloaded::Unloaded(const PJRT_Api* api, PJRT_LoadedExecutable* loaded) : api_(api) {
  KILN_PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args, args);
  args.loaded_executable = loaded;
  check(api, api->PJRT_LoadedExecutable_GetExecutable(&args), "PJRT_LoadedExecutable_GetExecutable");
  executable_ = args.executable;
}

Unloaded::~Unloaded() {
  KILN_PJRT_ARGS(PJRT_Executable_Destroy_Args, args);
  args.executable = executable_;
  discard(api_, api_->PJRT_Executable_Destroy(&args));
}

std::optional<PJRT_Executable_GetCompiledMemoryStats_Args> compiled_memory_stats(const PJRT_Api* api,
                                                                                 PJRT_Executable* exe) {
  if (api->PJRT_Executable_GetCompiledMemoryStats == nullptr) return std::nullopt;
  KILN_PJRT_ARGS(PJRT_Executable_GetCompiledMemoryStats_Args, stats);
  stats.executable = exe;
  if (PJRT_Error* error = api->PJRT_Executable_GetCompiledMemoryStats(&stats)) {
    discard(api, error);
    return std::nullopt;
  }
  return stats;
}

// ---- Executable

PluginExecutable::PluginExecutable(std::shared_ptr<const Plugin> plugin, PJRT_LoadedExecutable* loaded,
                                   std::vector<ArraySpec> parameters)
    : Executable(describe(*plugin, loaded, std::move(parameters))), plugin_(std::move(plugin)), loaded_(loaded) {}

PluginExecutable::~PluginExecutable() {
  KILN_PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args, args);
  args.executable = loaded_;
  discard(plugin_->api, plugin_->api->PJRT_LoadedExecutable_Destroy(&args));
}

std::string PluginExecutable::serialize() const {
  const PJRT_Api* api = plugin_->api;
  Unloaded exe(api, loaded_);
  KILN_PJRT_ARGS(PJRT_Executable_Serialize_Args, args);
  args.executable = exe.get();
  check(api, api->PJRT_Executable_Serialize(&args), "PJRT_Executable_Serialize");
  std::string out(kMagic);
  for (const ArraySpec& p : parameters()) out += " " + tensor_type(p);
  out += "\n";
  out.append(args.serialized_bytes, args.serialized_bytes_size);
  if (args.serialized_executable_deleter) args.serialized_executable_deleter(args.serialized_executable);
  return out;
}

// ---- compiling

PJRT_Program mlir_program(std::string& code) {
  KILN_PJRT_ARGS(PJRT_Program, program);
  program.code = code.data();
  program.code_size = code.size();
  static constexpr std::string_view kFormat = "mlir";
  program.format = kFormat.data();
  program.format_size = kFormat.size();
  return program;
}

std::shared_ptr<Executable> PluginClient::compile(std::string_view mlir_text, int num_replicas,
                                                  int num_partitions, const std::vector<int>& replica_devices) {
  KILN_CHECK(!mlir_text.empty(), "PJRT compile: the module text is empty");
  const size_t need = size_t(num_replicas) * size_t(num_partitions);
  KILN_CHECK(num_replicas >= 1 && num_partitions >= 1 && need <= devices().size(),
             "PJRT compile: " << num_replicas << " replicas x " << num_partitions
                              << " partitions do not fit the " << devices().size() << " devices of the "
                              << platform_name() << " client");
  std::vector<ArraySpec> parameters = main_parameters(mlir_text);
  std::vector<int64_t> replica_device_ids;
  for (const int index : replica_devices) {
    check_device_index(index, "PJRT compile");
    for (const int64_t id : replica_device_ids)
      KILN_CHECK(id != devices()[size_t(index)].id,
                 "PJRT compile: device " << index << " is named twice among the replicas' devices");
    replica_device_ids.push_back(devices()[size_t(index)].id);
  }
  const std::string options =
      compile_options_proto(num_replicas, num_partitions, need == 1, replica_device_ids);
  std::string code(mlir_text);
  const PJRT_Program program = mlir_program(code);
  const PJRT_Api* api = plugin_->api;
  KILN_PJRT_ARGS(PJRT_Client_Compile_Args, args);
  args.client = plugin_->client;
  args.program = &program;
  args.compile_options = options.data();
  args.compile_options_size = options.size();
  check(api, api->PJRT_Client_Compile(&args), "PJRT_Client_Compile");
  auto executable = std::make_shared<PluginExecutable>(plugin_, args.executable, std::move(parameters));
  KILN_CHECK(replica_devices.empty() || executable->devices() == replica_devices,
             "PJRT compile: the plugin placed the replicas on other devices than the assignment asked for");
  return executable;
}

std::shared_ptr<Executable> PluginClient::deserialize(std::string_view bytes) {
  const size_t eol = bytes.find('\n');
  KILN_CHECK(bytes.starts_with(kMagic) && eol != std::string_view::npos,
             "PJRT deserialize: the bytes are not an executable from Executable::serialize (no '"
                 << kMagic << "' header)");
  std::vector<ArraySpec> parameters;
  std::istringstream header(std::string(bytes.substr(kMagic.size(), eol - kMagic.size())));
  for (std::string type; header >> type;) parameters.push_back(parse_tensor_type(type));
  const std::string_view payload = bytes.substr(eol + 1);
  KILN_CHECK(!payload.empty(), "PJRT deserialize: the executable's bytes are missing after its header");
  const PJRT_Api* api = plugin_->api;
  KILN_PJRT_ARGS(PJRT_Executable_DeserializeAndLoad_Args, args);
  args.client = plugin_->client;
  args.serialized_executable = payload.data();
  args.serialized_executable_size = payload.size();
  check(api, api->PJRT_Executable_DeserializeAndLoad(&args), "PJRT_Executable_DeserializeAndLoad");
  return std::make_shared<PluginExecutable>(plugin_, args.loaded_executable, std::move(parameters));
}

// ---- running

void PluginClient::check_arguments(const Executable& executable,
                                   const std::vector<std::shared_ptr<Buffer>>& arguments, int device_index,
                                   const char* what) const {
  const auto& params = executable.parameters();
  KILN_CHECK(arguments.size() == params.size(),
             what << ": " << arguments.size() << " arguments given, the executable takes " << params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Buffer* b = arguments[i].get();
    KILN_CHECK(b, what << ": argument " << i << " is null");
    const auto* own = dynamic_cast<const PluginBuffer*>(b);
    KILN_CHECK(own && own->plugin() == plugin_.get(),
               what << ": argument " << i << " is a buffer of another PJRT client");
    KILN_CHECK(b->dtype() == params[i].dtype && b->dims() == params[i].dims,
               what << ": argument " << i << " is " << dtype_name(b->dtype()) << shape_str(b->dims())
                    << ", the executable expects " << dtype_name(params[i].dtype)
                    << shape_str(params[i].dims));
    KILN_CHECK(b->device_index() == device_index,
               what << ": argument " << i << " is on device " << b->device_index()
                    << ", the executable runs it on device " << device_index);
  }
}

std::vector<std::vector<std::shared_ptr<Buffer>>> PluginClient::run(
    const Executable& executable, const std::vector<std::vector<std::shared_ptr<Buffer>>>& arguments,
    const std::vector<int>& device_indices, bool portable) {
  const PJRT_Api* api = plugin_->api;
  const size_t num_devices = arguments.size(), num_args = executable.parameters().size();
  const size_t num_outputs = executable.outputs().size();
  std::vector<std::vector<PJRT_Buffer*>> in(num_devices),
      out(num_devices, std::vector<PJRT_Buffer*>(num_outputs));
  std::vector<PJRT_Buffer* const*> in_lists(num_devices);
  std::vector<PJRT_Buffer**> out_lists(num_devices);
  for (size_t d = 0; d < num_devices; ++d) {
    for (const auto& b : arguments[d]) in[d].push_back(static_cast<const PluginBuffer&>(*b).get());
    in_lists[d] = in[d].data();
    out_lists[d] = out[d].data();
  }
  KILN_PJRT_ARGS(PJRT_ExecuteOptions, options);
  KILN_PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args, args);
  args.executable = static_cast<const PluginExecutable&>(executable).get();
  args.options = &options;
  args.argument_lists = in_lists.data();
  args.num_devices = num_devices;
  args.num_args = num_args;
  args.output_lists = out_lists.data();
  if (portable) args.execute_device = plugin_->devices[device_indices[0]];
  check(api, api->PJRT_LoadedExecutable_Execute(&args), "PJRT_LoadedExecutable_Execute");
  // The outputs are futures: their ready events carry the computation's errors (Buffer::await_ready).
  std::vector<std::vector<std::shared_ptr<Buffer>>> result(num_devices);
  for (size_t d = 0; d < num_devices; ++d) {
    for (size_t o = 0; o < num_outputs; ++o) {
      const ArraySpec& spec = executable.outputs()[o];
      result[d].push_back(
          std::make_shared<PluginBuffer>(plugin_, out[d][o], spec.dtype, spec.dims, device_indices[d]));
    }
  }
  return result;
}

std::vector<std::vector<std::shared_ptr<Buffer>>> PluginClient::execute(
    const Executable& executable, const std::vector<std::vector<std::shared_ptr<Buffer>>>& arguments) {
  constexpr const char* kWhat = "PJRT execute";
  const std::vector<int>& devices = executable.devices();
  if (devices.empty()) {  // portable (1 x 1): run where the arguments are, device 0 without arguments
    KILN_CHECK(arguments.size() == 1,
               kWhat << ": " << arguments.size() << " argument lists given for a 1-device executable");
    const int device = arguments[0].empty() || !arguments[0][0] ? 0 : arguments[0][0]->device_index();
    return {execute_on(executable, arguments[0], device)};
  }
  KILN_CHECK(arguments.size() == devices.size(),
             kWhat << ": " << arguments.size() << " argument lists given, the "
                   << "executable runs on " << devices.size() << " devices");
  for (size_t d = 0; d < devices.size(); ++d) check_arguments(executable, arguments[d], devices[d], kWhat);
  return run(executable, arguments, devices, false);
}

std::vector<std::shared_ptr<Buffer>> PluginClient::execute_on(const Executable& executable,
                                                              const std::vector<std::shared_ptr<Buffer>>& arguments,
                                                              int device_index) {
  constexpr const char* kWhat = "PJRT execute_on";
  KILN_CHECK(executable.devices().empty(),
             kWhat << ": the executable was compiled for " << executable.num_replicas() << " replicas x "
                   << executable.num_partitions()
                   << " partitions; only a 1 x 1 executable runs on a chosen device");
  check_device_index(device_index, kWhat);
  check_arguments(executable, arguments, device_index, kWhat);
  return run(executable, {arguments}, {device_index}, true)[0];
}

}  // namespace kiln::pjrt
