// The CPU JIT for fused elementwise regions: generate C++ (graph/cpu_codegen.h), compile it with the system
// compiler into a shared object, dlopen it, and cache the result
//   - in memory, by the region's structural key (never by scalar values: a new denoising step with another
//     sigma reuses the kernel);
//   - on disk under KILN_CACHE_DIR/kernels (default ~/.cache/kiln/kernels), keyed by the structural key, the
//     ISA variant, the compiler's version, the Kiln version and the embedded math, so a second process skips
//     the compile. Each entry is a .so plus a .meta holding the full key and a checksum of the .so; both are
//     written atomically, and an entry whose key, size or checksum does not match is rebuilt, never loaded.
// Without a working compiler every request returns "fall back" (nullptr / false) after one warning.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "graph/elementwise_region.h"
#include "graph/jit_compiler.h"
#include "kiln/core/tensor.h"

namespace kiln::graph {

struct JitOptions {
  std::string compiler;   // empty: CXX, else c++/g++ (see JitCompiler)
  std::string cache_dir;  // the kernels folder itself; empty: no disk cache
  int isa = -1;           // 1: avx512 kernels, 0: generic, -1: the variant the unfused kernels use
  // compiler from nothing (CXX is read by JitCompiler), cache_dir from KILN_CACHE_DIR (or ~/.cache/kiln)
  // + "/kernels".
  static JitOptions from_env();
};

struct JitCounters {
  int64_t compiled = 0;       // kernels built by the compiler
  int64_t memory_hits = 0;    // requests served from the in-memory cache
  int64_t disk_hits = 0;      // kernels loaded from the on-disk cache
  int64_t disk_misses = 0;    // on-disk lookups that found no usable entry (absent, corrupt or stale)
  int64_t disk_rejected = 0;  // of those, entries present but corrupt or stale (rebuilt)
  int64_t fallbacks = 0;      // requests answered "use the unfused ops"
};

// A loaded kernel. Keeps its shared object open for as long as it lives.
class FusedKernel {
 public:
  using Entry = void (*)(char* const* ptrs, const float* scalars);
  FusedKernel(void* handle, Entry entry, std::string key)
      : handle_(handle), entry_(entry), key_(std::move(key)) {}
  ~FusedKernel();
  FusedKernel(const FusedKernel&) = delete;
  FusedKernel& operator=(const FusedKernel&) = delete;

  // ptrs: the inputs' element-0 pointers, then the outputs'; scalars: already rounded (see run()).
  void operator()(char* const* ptrs, const float* scalars) const { entry_(ptrs, scalars); }
  const std::string& key() const { return key_; }

 private:
  void* handle_;
  Entry entry_;
  std::string key_;
};

class CpuJit {
 public:
  explicit CpuJit(JitOptions options) : CpuJit(std::move(options), false) {}
  // The process-wide instance, configured from the environment.
  static CpuJit& global();

  // Whether kernels can be built (a compiler answered). Warns once when not.
  bool available();

  // The kernel for `region` (any layout; it is canonicalised), compiled or loaded as needed; nullptr when the
  // caller must fall back to the unfused ops (no compiler, or the compile failed: both warn).
  std::shared_ptr<const FusedKernel> kernel(const ElementwiseRegion& region);

  // Runs `region` on tensors: inputs laid out as the region declared them (dtype and strides over the
  // region's shape), contiguous outputs of the region's shape and dtypes, and one double per scalar
  // (rounded to the scalar's dtype, as the unfused op would). Waits for pending work on the inputs first.
  // Returns false, having done nothing, when the caller must fall back.
  bool run(const ElementwiseRegion& region, const std::vector<Tensor>& inputs,
           const std::vector<double>& scalars, const std::vector<Tensor>& outputs);

  // Runs a kernel obtained from kernel(region) on operands already checked against `region` (as run() checks
  // them), on the calling thread, without waiting for anything: for callers that order the work themselves
  // (a lazy-graph flush enqueues this on the device stream behind the ops that produce the inputs).
  static void invoke(const FusedKernel& kernel, const ElementwiseRegion& region,
                     const std::vector<Tensor>& inputs, const std::vector<double>& scalars,
                     const std::vector<Tensor>& outputs);

  JitCounters counters() const;
  // Forgets the loaded kernels (as a new process would start); the disk cache stays.
  void clear_memory_cache();
  const std::string& cache_dir() const { return options_.cache_dir; }
  bool avx512() const { return avx512_; }

 private:
  CpuJit(JitOptions options, bool report_to_counters);

  const bool report_to_counters_;  // the process-wide instance's counts go to kiln::counters() too
  std::shared_ptr<const FusedKernel> build(const ElementwiseRegion& canonical, const std::string& full_key);
  std::shared_ptr<const FusedKernel> load_from_disk(const std::string& entry_path,
                                                    const std::string& full_key);
  void warn_fallback(const std::string& why);

  JitOptions options_;
  bool avx512_;
  JitCompiler compiler_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const FusedKernel>> memory_;
  std::set<std::string> failed_;  // structural keys whose compile failed: not retried
  // Counts `event`; the process-wide instance also reports it to kiln::counters()
  // (runtime/counter_updates.h).
  void note(int64_t JitCounters::*event);

  JitCounters counters_;
  bool warned_ = false;
};

}  // namespace kiln::graph
