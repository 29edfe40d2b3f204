// The flags that say how pipelines are loaded and run, shared by `kiln generate` and `kiln serve`: the
// device, compute dtype, execution mode, packed weights, offload, memory budget, VAE tiling and tensor
// parallelism. One definition, so that both commands take the same spellings, defaults and checks.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kiln/pipelines/diffusion_pipeline.h"

namespace CLI {
class App;  // <CLI/CLI.hpp>, included only where flags are defined
}  // namespace CLI

namespace kiln::cli {

struct ExecutionFlags {
  std::string device = "cpu";  // cpu, xla-cpu, cuda or tpu, optionally :N (cli/device_flag.h)
  std::string dtype = "bf16";
  std::optional<std::string> mode;  // unset: as the environment says (KILN_DEFER_AND_FUSE)
  std::optional<std::string> packed_weights;
  std::string offload = "auto";
  std::optional<std::string> max_memory;
  std::optional<int> blocks_per_group;  // --offload group only (1 when absent)
  bool vae_tiling = false;
  std::optional<int64_t> vae_tile_size;
  int tp = 1;
};

// Adds --device, --dtype, --mode, --packed-weights, --offload, --blocks-per-group, --max-memory,
// --vae-tiling,
// --vae-tile-size and --tp to `command`. `tp_reporter` ends the --tp help: what rank 0 does that the other
// ranks do not ("reports and writes the PNG").
void add_execution_flags(CLI::App& command, ExecutionFlags& flags, const std::string& tp_reporter);

// Throws kiln::Error naming the flag: a device no backend knows or a flag it cannot take, a size or count out
// of its limit, a budget that does not parse, offload flags that contradict each other.
void check_execution_flags(const ExecutionFlags& flags);

// The load options the flags give (dtype, packed-weight budget, tensor parallelism).
PipelineLoadOptions load_options_from(const ExecutionFlags& flags);
// What `kiln generate` and `kiln serve` report once a pipeline is configured on a device with nothing
// offloaded: "every component on xla-cpu:0", with ", split over 2 devices to xla-cpu:1 (one thread each)"
// under in-process ranks; nothing on the cpu or under offload (configure's lines said it).
std::optional<std::string> placement_line(const DiffusionPipeline& pipe, const Device& device);

// Applies VAE tiling and the mode, offload and memory budget (DiffusionPipeline::configure), the components
// computing on `device` (--device: offloaded onto it, or moved there); returns the lines configure() reports.
// `sized_for`: the call a memory budget on a device is planned for (the pipeline's defaults when absent).
std::vector<std::string> configure_pipeline(DiffusionPipeline& pipe, const ExecutionFlags& flags,
                                            Device device,
                                            const std::optional<PipelineRequest>& sized_for = std::nullopt);

// --tp N: the process group must already hold N ranks (mpirun -np N, or `kiln launch -n N`); joins it.
// Throws naming `command` (generate, serve) and how to start it when the process count differs.
void join_tensor_parallel_group(int tp, const std::string& command);

// Whether --tp N on `device` runs its ranks as threads of this process (kiln/dist/local_ranks.h): N > 1 on a
// PJRT device (rank r on the device r places after it) when mpirun did not start several processes.
bool tensor_parallel_in_process(int tp, const Device& device);

// Runs a command's work, `on_rank(device)` with the --device flag's device, on every rank of --tp: as threads
// of this process, one per device, on a PJRT device (every rank's device reached before any work), otherwise
// here as this process's rank of mpirun's group (joined first; `command` names it in errors). Each rank
// works on device_of_rank(device, dist::rank()).
void run_on_tensor_parallel_ranks(const ExecutionFlags& flags, const std::string& command,
                                  const std::function<void(const Device& device)>& on_rank);

}  // namespace kiln::cli
