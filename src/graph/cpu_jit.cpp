#include "graph/cpu_jit.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backends/cpu/cpu_features.h"
#include "graph/cpu_codegen.h"
#include "io/atomic_file.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "kiln/core/log.h"
#include "kiln/runtime/execution_context.h"
#include "runtime/counter_updates.h"

namespace kiln::graph {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOp = "fused_elementwise";
constexpr const char* kMetaMagic = "kiln-jit-kernel 1";

std::string read_file(const std::string& path, bool* ok) {
  std::ifstream f(path, std::ios::binary);
  *ok = static_cast<bool>(f);
  if (!*ok) return {};
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Checksum of a cached .so, seeded with its full key so that a .so moved under another entry fails too.
std::string so_checksum(const std::string& bytes, const std::string& full_key) {
  return hex64(fnv1a64(bytes.data(), bytes.size(), fnv1a64(full_key.data(), full_key.size())));
}

std::string meta_text(const std::string& so_bytes, const std::string& full_key) {
  std::ostringstream m;
  m << kMetaMagic << "\nsize " << so_bytes.size() << "\nchecksum " << so_checksum(so_bytes, full_key)
    << "\nkey\n"
    << full_key;
  return m.str();
}

std::string symbol_for(uint64_t hash) {
  return "kiln_fused_" + hex64(hash);
}

float rounded_scalar(double v, DType d) {
  return visit_dtype(d, [&](auto tag) {
    return static_cast<float>(scalar_to_double(scalar_from_double<decltype(tag)>(v)));
  });
}

std::string fresh_dir(const std::string& parent) {
  static std::atomic<int> counter{0};
  const fs::path p =
      fs::path(parent) / ("build-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  fs::create_directories(p);
  return p.string();
}

}  // namespace

FusedKernel::~FusedKernel() {
  if (handle_) dlclose(handle_);
}

JitOptions JitOptions::from_env() {
  JitOptions o;
  const char* dir = std::getenv("KILN_CACHE_DIR");
  if (dir && *dir) {
    o.cache_dir = (fs::path(dir) / "kernels").string();
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    o.cache_dir = (fs::path(home) / ".cache" / "kiln" / "kernels").string();
  }
  return o;
}

CpuJit::CpuJit(JitOptions options, bool report_to_counters)
    : report_to_counters_(report_to_counters),
      options_(std::move(options)),
      avx512_(options_.isa < 0 ? cpu_kernels::use_avx512() : options_.isa == 1),
      compiler_(options_.compiler) {
  KILN_CHECK(!(avx512_ && !cpu_kernels::cpu_features().avx512),
             kOp << ": AVX-512 kernels requested, but this CPU has no AVX-512");
}

CpuJit& CpuJit::global() {
  static CpuJit jit(JitOptions::from_env(), /*report_to_counters=*/true);
  return jit;
}

void CpuJit::note(int64_t JitCounters::*event) {
  ++(counters_.*event);
  if (!report_to_counters_) return;
  if (event == &JitCounters::compiled) runtime::count_kernel_compiled();
  if (event == &JitCounters::memory_hits) runtime::count_kernel_cache_memory_hit();
  if (event == &JitCounters::disk_hits) runtime::count_kernel_cache_disk_hit();
  if (event == &JitCounters::disk_misses) runtime::count_kernel_cache_disk_miss();
}

void CpuJit::warn_fallback(const std::string& why) {
  if (warned_) return;
  warned_ = true;
  warn("CPU JIT: " + why + "; fused elementwise kernels are disabled and the unfused ops run instead");
}

bool CpuJit::available() {
  std::lock_guard lock(mutex_);
  if (compiler_.available()) return true;
  warn_fallback("no C++ compiler found (tried " + compiler_.description() + ")");
  return false;
}

std::shared_ptr<const FusedKernel> CpuJit::kernel(const ElementwiseRegion& region) {
  const ElementwiseRegion canonical = region.canonical();
  KILN_CHECK(!canonical.outputs().empty(), kOp << ": the region has no outputs");
  const std::string key = canonical.structural_key();
  std::lock_guard lock(mutex_);
  if (auto it = memory_.find(key); it != memory_.end()) {
    note(&JitCounters::memory_hits);
    return it->second;
  }
  if (!compiler_.available()) {
    warn_fallback("no C++ compiler found (tried " + compiler_.description() + ")");
    note(&JitCounters::fallbacks);
    return nullptr;
  }
  if (failed_.count(key)) {
    note(&JitCounters::fallbacks);
    return nullptr;
  }
  const std::string full_key = key + "\nisa=" + (avx512_ ? "avx512" : "generic") +
                               "\ncompiler=" + compiler_.version() + "\nflags=" + JitCompiler::base_flags() +
                               " " + jit_isa_flags(avx512_) + "\ncodegen=" + codegen_fingerprint();
  std::shared_ptr<const FusedKernel> k;
  if (!options_.cache_dir.empty()) {
    const std::string entry =
        (fs::path(options_.cache_dir) / hex64(fnv1a64(full_key.data(), full_key.size()))).string();
    k = load_from_disk(entry, full_key);
  }
  if (!k) k = build(canonical, full_key);
  if (!k) {
    failed_.insert(key);
    note(&JitCounters::fallbacks);
    return nullptr;
  }
  memory_.emplace(key, k);
  return k;
}

std::shared_ptr<const FusedKernel> CpuJit::load_from_disk(const std::string& entry,
                                                          const std::string& full_key) {
  bool ok_meta = false, ok_so = false;
  const std::string meta = read_file(entry + ".meta", &ok_meta);
  if (!ok_meta) {
    note(&JitCounters::disk_misses);
    return nullptr;
  }
  const std::string so = read_file(entry + ".so", &ok_so);
  // The whole .meta must be what this .so and key would produce: any corruption, truncation, a different
  // key (hash collision, other compiler or Kiln) or a replaced .so fails the comparison.
  if (!ok_so || meta != meta_text(so, full_key)) {
    note(&JitCounters::disk_misses);
    note(&JitCounters::disk_rejected);
    return nullptr;
  }
  void* handle = dlopen((entry + ".so").c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    note(&JitCounters::disk_misses);
    note(&JitCounters::disk_rejected);
    return nullptr;
  }
  const std::string structural = full_key.substr(0, full_key.find('\n'));
  const std::string sym = symbol_for(fnv1a64(structural.data(), structural.size()));
  auto entry_fn = reinterpret_cast<FusedKernel::Entry>(dlsym(handle, sym.c_str()));
  if (!entry_fn) {
    dlclose(handle);
    note(&JitCounters::disk_misses);
    note(&JitCounters::disk_rejected);
    return nullptr;
  }
  note(&JitCounters::disk_hits);
  return std::make_shared<FusedKernel>(handle, entry_fn, structural);
}

std::shared_ptr<const FusedKernel> CpuJit::build(const ElementwiseRegion& canonical,
                                                 const std::string& full_key) {
  const std::string structural = canonical.structural_key();
  const std::string sym = symbol_for(fnv1a64(structural.data(), structural.size()));
  const std::string source = generate_cpu_source(canonical, sym, avx512_);

  // Build in a private folder (under the cache when there is one, so the final rename stays on one
  // filesystem), then publish the .so and its .meta atomically.
  std::error_code ec;
  bool persist = !options_.cache_dir.empty();
  if (persist) {
    fs::create_directories(options_.cache_dir, ec);
    if (ec) {
      warn("CPU JIT: cannot create the kernel cache " + options_.cache_dir + " (" + ec.message() +
           "); kernels will be compiled in every process");
      persist = false;
    }
  }
  std::string dir;
  try {
    dir = fresh_dir(persist ? options_.cache_dir : fs::temp_directory_path().string());
  } catch (const fs::filesystem_error& e) {
    warn_fallback(std::string("cannot create a build folder: ") + e.what());
    return nullptr;
  }
  const std::string src_path = dir + "/kernel.cpp", so_path = dir + "/kernel.so";
  {
    std::ofstream f(src_path, std::ios::binary);
    f << source;
  }
  const auto error = compiler_.compile(src_path, so_path, jit_isa_flags(avx512_));
  if (error) {
    warn("CPU JIT: compiling a fused elementwise kernel failed; that region runs unfused. " + *error);
    fs::remove_all(dir, ec);
    return nullptr;
  }
  note(&JitCounters::compiled);
  if (log_enabled("compile"))
    log("compile", "built fused kernel " + sym + " (a region structure not in the memory or disk cache" +
                       (persist ? ", now saved to " + options_.cache_dir : std::string()) +
                       "): " + structural);
  std::string load_path = so_path;
  if (persist) {
    bool ok = false;
    const std::string bytes = read_file(so_path, &ok);
    const std::string entry =
        (fs::path(options_.cache_dir) / hex64(fnv1a64(full_key.data(), full_key.size()))).string();
    try {
      // .so first, .meta last: the .meta commits the entry.
      io::AtomicFile so_file(entry + ".so");
      so_file.write(bytes.data(), bytes.size());
      so_file.commit();
      const std::string meta = meta_text(bytes, full_key);
      io::AtomicFile meta_file(entry + ".meta");
      meta_file.write(meta.data(), meta.size());
      meta_file.commit();
      load_path = entry + ".so";
    } catch (const Error& e) {
      warn(std::string("CPU JIT: cannot write the kernel cache: ") + e.what());
    }
  }
  void* handle = dlopen(load_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    warn(std::string("CPU JIT: cannot load a compiled kernel: ") + dlerror());
    fs::remove_all(dir, ec);
    return nullptr;
  }
  auto entry_fn = reinterpret_cast<FusedKernel::Entry>(dlsym(handle, sym.c_str()));
  fs::remove_all(dir, ec);  // the loaded object stays mapped
  if (!entry_fn) {
    dlclose(handle);
    warn("CPU JIT: a compiled kernel lacks its entry point " + sym);
    return nullptr;
  }
  return std::make_shared<FusedKernel>(handle, entry_fn, structural);
}

bool CpuJit::run(const ElementwiseRegion& region, const std::vector<Tensor>& inputs,
                 const std::vector<double>& scalars, const std::vector<Tensor>& outputs) {
  const Shape& shape = region.shape();
  KILN_CHECK(inputs.size() == region.inputs().size(),
             kOp << ": expected " << region.inputs().size() << " inputs, got " << inputs.size());
  KILN_CHECK(outputs.size() == region.outputs().size(),
             kOp << ": expected " << region.outputs().size() << " outputs, got " << outputs.size());
  KILN_CHECK(static_cast<int>(scalars.size()) == region.scalar_count(),
             kOp << ": expected " << region.scalar_count() << " scalars, got " << scalars.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& t = inputs[k];
    const FusedInput& want = region.inputs()[k];
    KILN_CHECK(t.defined() && t.dtype() == want.dtype,
               kOp << ": input " << k << " must be " << dtype_name(want.dtype) << ", got "
                   << (t.defined() ? dtype_name(t.dtype()) : "an undefined tensor"));
    const Tensor e = t.expand(shape);
    for (size_t d = 0; d < shape.size(); ++d)
      KILN_CHECK(shape[d] == 1 || e.strides()[d] == want.strides[d],
                 kOp << ": input " << k << " has strides " << shape_str(e.strides()) << " over "
                     << shape_str(shape) << ", but the region was built for " << shape_str(want.strides));
  }
  for (size_t j = 0; j < outputs.size(); ++j) {
    const Tensor& t = outputs[j];
    KILN_CHECK(
        t.defined() && t.shape() == shape && t.is_contiguous() && t.dtype() == region.outputs()[j].dtype,
        kOp << ": output " << j << " must be a contiguous " << dtype_name(region.outputs()[j].dtype)
            << shape_str(shape) << " tensor, got "
            << (t.defined() ? std::string(dtype_name(t.dtype())) + shape_str(t.shape())
                            : "an undefined one"));
  }
  if (shape_numel(shape) == 0) return true;
  const auto k = kernel(region);
  if (!k) return false;
  synchronize(cpu);  // inputs may still be being written by queued ops
  invoke(*k, region, inputs, scalars, outputs);
  return true;
}

void CpuJit::invoke(const FusedKernel& kernel, const ElementwiseRegion& region,
                    const std::vector<Tensor>& inputs, const std::vector<double>& scalars,
                    const std::vector<Tensor>& outputs) {
  if (shape_numel(region.shape()) == 0) return;
  std::vector<char*> ptrs;
  ptrs.reserve(inputs.size() + outputs.size());
  for (const Tensor& t : inputs) ptrs.push_back(static_cast<char*>(t.raw_data()));
  for (const Tensor& t : outputs) ptrs.push_back(static_cast<char*>(t.raw_data()));
  std::vector<float> sc;
  sc.reserve(scalars.size());
  for (size_t i = 0; i < scalars.size(); ++i)
    sc.push_back(rounded_scalar(scalars[i], region.scalar_dtypes()[i]));
  kernel(ptrs.data(), sc.data());
}

JitCounters CpuJit::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

void CpuJit::clear_memory_cache() {
  std::lock_guard lock(mutex_);
  memory_.clear();
  failed_.clear();
}

}  // namespace kiln::graph
