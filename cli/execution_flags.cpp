#include "cli/execution_flags.h"

#include <CLI/CLI.hpp>

#include "cli/device_flag.h"
#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/dist/local_ranks.h"
#include "kiln/dist/process_group.h"
#include "kiln/pipelines/weight_packing.h"

namespace kiln::cli {

void add_execution_flags(CLI::App& cmd, ExecutionFlags& flags, const std::string& tp_reporter) {
  cmd.add_option(
         "--device", flags.device,
         "where the pipelines run: cpu, or a device reached through a PJRT plugin: xla-cpu (XLA's CPU "
         "compiler, for testing), cuda or tpu; :N picks the device index (cuda:1)")
      ->capture_default_str();
  cmd.add_option("--dtype", flags.dtype, "compute dtype: bf16, f32 or f16")
      ->check(CLI::IsMember({"bf16", "f32", "f16", "bfloat16", "float32", "float16"}))
      ->capture_default_str();
  cmd.add_option(
         "--mode", flags.mode,
         "execution mode: eager (strict eager, the default), fuse (deferred and fused), compile (the "
         "transformer compiled per shape), compile-blocks (its repeated blocks compiled once each); without "
         "it, "
         "strict eager unless KILN_DEFER_AND_FUSE=1")
      ->check(CLI::IsMember({"eager", "fuse", "compile", "compile-blocks"}));
  cmd.add_option("--packed-weights", flags.packed_weights,
                 "the most memory for packed copies of the weights (faster matmuls): a size such as 12GiB or "
                 "512MiB, all, or none (default: all when the weights fit in half of this machine's memory, "
                 "none otherwise: they are then read from the memory-mapped checkpoint, as diffusers does)");
  cmd.add_option(
         "--offload", flags.offload,
         "model: each component's weights are released once it has run (diffusers' "
         "enable_model_cpu_offload); group: weights read in place, a component's repeated blocks "
         "in groups of --blocks-per-group, the next group brought in while one runs "
         "(enable_group_offload); sequential: no packed copies and each weight released once the "
         "next is read (enable_sequential_cpu_offload); none: every component keeps them; auto "
         "(default): model when the weights exceed half of this machine's memory; on a device whose "
         "plugin reports its memory (cuda, tpu), what --max-memory would pick for what is free there. "
         "With --device xla-cpu/cuda/tpu, model and group keep the weights on the host and copy them "
         "into the device's memory as they run (sequential is the cpu's only)")
      ->check(CLI::IsMember({"auto", "none", "model", "group", "sequential"}))
      ->capture_default_str();
  cmd.add_option("--blocks-per-group", flags.blocks_per_group,
                 "blocks per group for --offload group (diffusers' num_blocks_per_group; default 1)")
      ->check(CLI::Range(1, 1000));
  cmd.add_option(
      "--max-memory", flags.max_memory,
      "the most memory the weights may hold, e.g. 12GiB: picks the coarsest offload that stays under "
      "it (none, model, group, sequential) and fails before any work when the largest weight does not fit; "
      "activations come on top. With --device xla-cpu/cuda/tpu: the most memory Kiln holds on the device, "
      "weights and activations: an estimate of the image's activations is kept free and the weights get the "
      "rest, picking none, model or group offload onto it");
  cmd.add_flag(
      "--vae-tiling", flags.vae_tiling,
      "decode in overlapping, blended tiles (diffusers' enable_vae_tiling): memory bounded by the tile");
  cmd.add_option(
         "--vae-tile-size", flags.vae_tile_size,
         "tile size in pixels for --vae-tiling (default: the VAE's sample_size, 1024 for FLUX.1 and SD3)")
      ->check(CLI::PositiveNumber);
  cmd.add_option(
         "--tp", flags.tp,
         "tensor-parallel degree: split the transformer and the T5 encoder (FLUX.2: its text encoder) "
         "over this many processes, started by `mpirun -np N` or `kiln launch -n N` (with --device on a "
         "PJRT device: over N devices from it, one thread each in this process); rank 0 " +
             tp_reporter)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

void check_execution_flags(const ExecutionFlags& flags) {
  parse_device_flag(flags.device, flags);
  if (flags.vae_tile_size)
    limits::check_range("--vae-tile-size", *flags.vae_tile_size, 1, limits::kMaxImageSide);
  limits::check_range("--tp", flags.tp, 1, limits::kMaxProcesses);
  if (flags.packed_weights) parse_byte_budget(*flags.packed_weights, "--packed-weights");
  if (flags.max_memory) parse_byte_budget(*flags.max_memory, "--max-memory");
  // Offload flags that contradict each other are refused before anything loads.
  KILN_CHECK(
      !flags.max_memory || flags.offload == "auto",
      "--max-memory " << *flags.max_memory << " picks the offload itself (none, model, group or sequential); "
                      << "it cannot be combined with --offload " << flags.offload << ": give one of the two");
  KILN_CHECK(!flags.blocks_per_group || flags.offload == "group",
             "--blocks-per-group sizes the groups of --offload group; got --offload " << flags.offload);
}

PipelineLoadOptions load_options_from(const ExecutionFlags& flags) {
  PipelineLoadOptions load;
  load.dtype = parse_dtype(flags.dtype);
  if (flags.packed_weights)
    load.packed_weight_budget = parse_byte_budget(*flags.packed_weights, "--packed-weights");
  load.tensor_parallel = flags.tp;
  return load;
}

std::vector<std::string> configure_pipeline(DiffusionPipeline& pipe, const ExecutionFlags& flags,
                                            Device device, const std::optional<PipelineRequest>& sized_for) {
  // Tiling first: a memory budget on a device plans with the VAE's activations as it will run.
  if (flags.vae_tiling) pipe.enable_vae_tiling(flags.vae_tile_size ? *flags.vae_tile_size : 0);
  ExecutionOptions execution;
  execution.device = device;
  execution.sized_for = sized_for;
  if (flags.mode) execution.mode = parse_execution_mode(*flags.mode);
  if (flags.max_memory) execution.max_memory = parse_byte_budget(*flags.max_memory, "--max-memory");
  if (flags.offload == "none") execution.offload = OffloadMode::None;
  if (flags.offload == "model") execution.offload = OffloadMode::Model;
  if (flags.offload == "group") execution.offload = OffloadMode::Group;
  if (flags.offload == "sequential") execution.offload = OffloadMode::Sequential;
  execution.blocks_per_group = flags.blocks_per_group.value_or(1);
  return pipe.configure(execution);
}

std::optional<std::string> placement_line(const DiffusionPipeline& pipe, const Device& device) {
  if (device.type == DeviceType::CPU || pipe.model_cpu_offload_enabled()) return std::nullopt;
  std::string line = "every component on " + device.str();
  if (dist::in_local_ranks())
    line += ", split over " + std::to_string(dist::world_size()) + " devices to " +
            device_of_rank(device, dist::world_size() - 1).str() + " (one thread each)";
  return line;
}

void join_tensor_parallel_group(int tp, const std::string& command) {
  if (tp == 1 && !dist::launched_by_mpirun()) return;
  if (!dist::is_initialized()) dist::init_process_group({.backend = "mpi"});
  KILN_CHECK(dist::world_size() == tp,
             "--tp " << tp << ": " << dist::world_size() << " process(es) were started; run `mpirun -np "
                     << tp << " kiln " << command << " --tp " << tp << " ...` or `kiln launch -n " << tp
                     << " -- " << command << " ...` (and give --tp the number of processes); on PJRT "
                     << "devices (--device xla-cpu|cuda|tpu) " << command
                     << " --tp runs the ranks in this process");
}

bool tensor_parallel_in_process(int tp, const Device& device) {
  return tp > 1 && device.type != DeviceType::CPU && !dist::launched_by_mpirun();
}

void run_on_tensor_parallel_ranks(const ExecutionFlags& flags, const std::string& command,
                                  const std::function<void(const Device& device)>& on_rank) {
  const Device device = parse_device_flag(flags.device, flags);
  // On the devices of one PJRT client the ranks are threads here, their collectives inside the devices'
  // executables; otherwise each rank is a process of mpirun's.
  if (tensor_parallel_in_process(flags.tp, device)) {
    require_device(device_of_rank(device, flags.tp - 1));  // every rank's device, before loading
    return dist::run_local_ranks(flags.tp, [&](int) { on_rank(device); });
  }
  join_tensor_parallel_group(flags.tp, command);
  on_rank(device);
}

}  // namespace kiln::cli
