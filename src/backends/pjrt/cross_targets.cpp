#include "backends/pjrt/cross_targets.h"

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>

#include "backends/pjrt/plugin_locator.h"
#include "backends/pjrt/tpu_host.h"
#include "core/cache_dir.h"
#include "kiln/core/error.h"
#include "kiln/runtime/cross_compile.h"

namespace kiln::pjrt {
namespace {

namespace fs = std::filesystem;

struct TpuGeneration {
  std::string_view name;           // as in the target name and libtpu's topology names
  std::string_view default_shape;  // 4 chips
  std::string_view accelerator;    // TPU_ACCELERATOR_TYPE of such a slice
};
constexpr TpuGeneration kTpus[] = {
    {"v4", "2x2x1", "v4-8"},
    {"v5e", "2x2", "v5litepod-4"},
    {"v5p", "2x2x1", "v5p-8"},
    {"v6e", "2x2", "v6e-4"},
};

// An NVIDIA GPU as XLA's GPU compiler needs it described (stream_executor.GpuTargetConfigProto, text form):
// the public figures of each part (compute capability, multiprocessors, shared memory and registers per
// multiprocessor, L2, memory size and bandwidth, clock) and the cuDNN version Kiln's attention lowering
// assumes. They steer XLA's tiling and fusion choices; the code is built for the compute capability.
struct Gpu {
  std::string_view name;
  std::string_view description;
  int major, minor;
  int multiprocessors;
  int fp32_units_per_multiprocessor;
  int threads_per_multiprocessor;
  int64_t shared_memory_per_multiprocessor, shared_memory_per_block_optin;
  int64_t l2_bytes;
  int64_t memory_bytes;
  int64_t memory_bandwidth;  // bytes per second
  double clock_ghz;
};
constexpr Gpu kGpus[] = {
    {"h200", "NVIDIA H200", 9, 0, 132, 128, 2048, 233472, 232448, 52428800, 150754820096, 4800000000000,
     1.98},
    {"h100", "NVIDIA H100 80GB HBM3", 9, 0, 132, 128, 2048, 233472, 232448, 52428800, 85520809984,
     3350000000000, 1.98},
    {"a100", "NVIDIA A100-SXM4-80GB", 8, 0, 108, 64, 2048, 167936, 166912, 41943040, 85198045184,
     2039000000000, 1.41},
    {"l4", "NVIDIA L4", 8, 9, 58, 128, 1536, 102400, 101376, 50331648, 24152899584, 300000000000, 2.04},
    {"rtx4090", "NVIDIA GeForce RTX 4090", 8, 9, 128, 128, 1536, 102400, 101376, 75497472, 25393692672,
     1008000000000, 2.52},
};

std::string gpu_target_config(const Gpu& g) {
  std::ostringstream p;
  p << "gpu_device_info {\n"
    << "  threads_per_block_limit: 1024\n  threads_per_warp: 32\n  shared_memory_per_block: 49152\n"
    << "  shared_memory_per_core: " << g.shared_memory_per_multiprocessor << "\n"
    << "  threads_per_core_limit: " << g.threads_per_multiprocessor << "\n"
    << "  core_count: " << g.multiprocessors << "\n  fpus_per_core: " << g.fp32_units_per_multiprocessor
    << "\n"
    << "  block_dim_limit_x: 2147483647\n  block_dim_limit_y: 65535\n  block_dim_limit_z: 65535\n"
    << "  memory_bandwidth: " << g.memory_bandwidth << "\n  l2_cache_size: " << g.l2_bytes << "\n"
    << "  clock_rate_ghz: " << g.clock_ghz << "\n  device_memory_size: " << g.memory_bytes << "\n"
    << "  shared_memory_per_block_optin: " << g.shared_memory_per_block_optin << "\n"
    << "  cuda_compute_capability { major: " << g.major << " minor: " << g.minor << " }\n"
    << "  registers_per_core_limit: 65536\n  registers_per_block_limit: 65536\n}\n"
    << "platform_name: \"CUDA\"\n"
    << "dnn_version_info { major: 9 minor: 10 patch: 0 }\n"
    << "device_description_str: \"" << g.description << "\"\n";
  return p.str();
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t end = s.find(sep, start);
    parts.push_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

[[noreturn]] void unknown(const std::string& name, const std::string& why) {
  std::ostringstream known;
  for (const std::string& k : known_cross_targets()) known << " " << k;
  KILN_FAIL("cross-compile target '" << name << "': " << why << " (known:" << known.str()
                                     << "; a TPU may add a shape, tpu:v5e:2x4, a GPU a count, cuda:h100:8)");
}

void set_if_unset(const char* name, const std::string& value) {
  if (!std::getenv(name)) setenv(name, value.c_str(), 0);
}

CrossTarget make_tpu(const std::string& name, const std::vector<std::string_view>& parts) {
  const TpuGeneration* gen = nullptr;
  for (const TpuGeneration& g : kTpus)
    if (g.name == parts[1]) gen = &g;
  if (!gen) unknown(name, "no TPU generation '" + std::string(parts[1]) + "'");
  const std::string shape(parts.size() > 2 ? parts[2] : gen->default_shape);
  const std::string plugin = find_cross_plugin("tpu");
  // Off a TPU VM, libtpu would ask the metadata server about the local TPU for minutes (tpu_host.h), and
  // would hold a lock file (/tmp/libtpu_lockfile) that fails every other process loading it; a topology needs
  // neither. Where chips exist the real answers are left alone.
  if (tpu_chip_count() == 0) {
    set_if_unset("TPU_SKIP_MDS_QUERY", "1");
    set_if_unset("ALLOW_MULTIPLE_LIBTPU_LOAD", "1");
    set_if_unset("TPU_ACCELERATOR_TYPE", std::string(gen->accelerator));
    set_if_unset("TPU_WORKER_ID", "0");
    set_if_unset("TPU_WORKER_HOSTNAMES", "localhost");
  }
  return {name, "tpu", Topology::create(plugin, std::string(gen->name) + ":" + shape)};
}

CrossTarget make_cuda(const std::string& name, const std::vector<std::string_view>& parts) {
  const Gpu* gpu = nullptr;
  for (const Gpu& g : kGpus)
    if (g.name == parts[1]) gpu = &g;
  if (!gpu) unknown(name, "no GPU '" + std::string(parts[1]) + "'");
  int count = 4;
  if (parts.size() > 2) {
    const std::string n(parts[2]);
    char* end = nullptr;
    const long v = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || v < 1 || v > 64) unknown(name, "the GPU count must be 1 to 64");
    count = int(v);
  }
  const std::vector<ClientOption> options = {{"target_config", gpu_target_config(*gpu)},
                                             {"topology", "1x1x" + std::to_string(count)}};
  return {name, "cuda", Topology::create(find_cross_plugin("cuda"), "", options)};
}

}  // namespace

std::vector<std::string> known_cross_targets() {
  std::vector<std::string> names;
  for (const TpuGeneration& g : kTpus) names.push_back("tpu:" + std::string(g.name));
  for (const Gpu& g : kGpus) names.push_back("cuda:" + std::string(g.name));
  return names;
}

std::string find_cross_plugin(const std::string& platform) {
  KILN_CHECK(platform == "tpu" || platform == "cuda",
             "cross-compiling: no plugin for platform '" << platform << "' (tpu or cuda)");
  const std::string file = platform == "tpu" ? "libtpu.so" : "xla_cuda_plugin.so";
  std::vector<std::string> candidates;
  if (const std::string cache = cache_dir(); !cache.empty())
    candidates.push_back((fs::path(cache) / "pjrt" / "cross" / file).string());
  for (const std::string& p : plugin_candidates(platform)) candidates.push_back(p);
  if (std::string found = first_existing_file(candidates); !found.empty()) return found;
  std::ostringstream message;
  message << "cross-compiling for " << platform << ": no " << file << " found. Get it with "
          << "./scripts/fetch_pjrt.sh --cross (or pip install "
          << (platform == "tpu" ? "libtpu" : "jax-cuda13-pjrt") << "). Looked in:";
  for (const std::string& path : candidates) message << "\n  " << path;
  KILN_FAIL(message.str());
}

CrossTarget cross_target(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, CrossTarget> made;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = made.find(name); it != made.end()) return it->second;
  const std::vector<std::string_view> parts = split(name, ':');
  if (parts.size() < 2 || parts.size() > 3) unknown(name, "expected platform:model");
  CrossTarget t;
  if (parts[0] == "tpu")
    t = make_tpu(name, parts);
  else if (parts[0] == "cuda")
    t = make_cuda(name, parts);
  else
    unknown(name, "no platform '" + std::string(parts[0]) + "'");
  made.emplace(name, t);
  return t;
}

}  // namespace kiln::pjrt

namespace kiln {

std::vector<CrossCompilePlatform> cross_compile_platforms() {
  std::vector<CrossCompilePlatform> out;
  for (const char* platform : {"tpu", "cuda"}) {
    CrossCompilePlatform p;
    p.platform = platform;
    for (const std::string& t : pjrt::known_cross_targets())
      if (t.starts_with(p.platform + ":")) p.targets.push_back(t);
    try {
      p.plugin = pjrt::find_cross_plugin(p.platform);
    } catch (const Error& e) {
      p.missing = e.what();
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace kiln
