#include "backends/cpu/matmul_path.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/instruction_rates.h"
#include "kiln/core/error.h"
#include "kiln/core/log.h"

namespace kiln::cpu_kernels {

namespace {

std::atomic<int> g_override{-1};  // a Bf16Path while a ScopedBf16Path lives

Bf16Path decide() {
  const char* forced = std::getenv("KILN_CPU_MATMUL");
  const std::string value = forced ? forced : "";
  if (value == "onednn") return Bf16Path::Onednn;
  if (value == "fma32") return Bf16Path::Fma32;
  if (value == "amx") {
    KILN_CHECK(use_avx512() && amx_usable(),
               "KILN_CPU_MATMUL=amx: this "
                   << (use_avx512() ? "process cannot use AMX tiles (the CPU has no "
                                      "amx_bf16, KILN_CPU_ISA=avx512, or Linux refused the tile state)"
                                    : "process runs the portable kernels (no AVX-512 "
                                      "with bf16, or KILN_CPU_ISA=generic)")
                   << "; expected onednn, fma32 or auto here");
    return Bf16Path::Amx;
  }
  KILN_CHECK(
      value.empty() || value == "auto",
      "KILN_CPU_MATMUL=" << value << " is not a bf16 matmul path (expected onednn, fma32, amx or auto)");
  if (!use_avx512()) return Bf16Path::Onednn;
  const InstructionRates& r = host_instruction_rates();
  if (amx_usable() && r.tdpbf16 > 0 && r.tdpbf16 >= std::max(r.dpbf16, r.fma32)) return Bf16Path::Amx;
  const double bf16 = std::max(r.dpbf16, r.tdpbf16);
  return r.fma32 > kFma32Margin * bf16 ? Bf16Path::Fma32 : Bf16Path::Onednn;
}

}  // namespace

Bf16Path bf16_path() {
  if (const int forced = g_override.load(std::memory_order_relaxed); forced >= 0)
    return static_cast<Bf16Path>(forced);
  static const Bf16Path path = [] {
    const Bf16Path p = decide();
    if (log_enabled("matmul")) {
      std::ostringstream s;
      const char* forced = std::getenv("KILN_CPU_MATMUL");
      s << "bf16 products on " << bf16_path_name(p);
      if (forced && *forced && std::strcmp(forced, "auto") != 0) {
        s << " (forced by KILN_CPU_MATMUL)";
      } else if (!use_avx512()) {
        s << " (portable kernels in use)";
      } else {
        s << " (per-core GFLOP/s: " << host_instruction_rates().describe() << ")";
      }
      log("matmul", s.str());
    }
    return p;
  }();
  return path;
}

ScopedBf16Path::ScopedBf16Path(Bf16Path path) : previous_(g_override.exchange(static_cast<int>(path))) {}
ScopedBf16Path::~ScopedBf16Path() {
  g_override.store(previous_);
}

bool bf16_path_forced() {
  if (g_override.load(std::memory_order_relaxed) >= 0) return true;
  static const bool forced = [] {
    const char* v = std::getenv("KILN_CPU_MATMUL");
    return v != nullptr && *v != '\0' && std::strcmp(v, "auto") != 0;
  }();
  return forced;
}

const char* bf16_path_name(Bf16Path path) {
  switch (path) {
    case Bf16Path::Fma32:
      return "fma32";
    case Bf16Path::Amx:
      return "amx";
    case Bf16Path::Onednn:
      break;
  }
  return "onednn";
}

}  // namespace kiln::cpu_kernels
