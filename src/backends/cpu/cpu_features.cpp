#include "backends/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace kiln::cpu_kernels {

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
    __builtin_cpu_init();
    f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
    f.fma = __builtin_cpu_supports("fma");
    return f;
  }();
  return features;
}

bool use_avx512() {
  // KILN_CPU_ISA=generic forces the portable kernels, so both variants can be tested on one machine.
  static const bool use = [] {
    const char* forced = std::getenv("KILN_CPU_ISA");
    if (forced && std::strcmp(forced, "generic") == 0) return false;
    return cpu_features().avx512 && cpu_features().avx512_bf16;
  }();
  return use;
}

const char* cpu_isa_name() {
  return use_avx512() ? "avx512" : "generic";
}

}  // namespace kiln::cpu_kernels
