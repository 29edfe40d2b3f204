#include "backends/cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln::cpu_kernels {

namespace {

// CPUID.(EAX=7,ECX=0):EDX bits 22 (AMX-BF16) and 24 (AMX-TILE), and XCR0 bits 17 (XTILECFG) and 18
// (XTILEDATA): the OS manages the tile state.
bool detect_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if ((edx & (1u << 22)) == 0 || (edx & (1u << 24)) == 0) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & (1u << 27)) == 0) return false;  // OSXSAVE
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  constexpr uint32_t kTileState = (1u << 17) | (1u << 18);
  return (xcr0_lo & kTileState) == kTileState;
}

// KILN_CPU_ISA, read once: the most of this CPU that the process uses.
enum class IsaCap { Generic, Avx512, Auto };

IsaCap isa_cap() {
  static const IsaCap cap = [] {
    const char* v = std::getenv("KILN_CPU_ISA");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return IsaCap::Auto;
    if (std::strcmp(v, "generic") == 0) return IsaCap::Generic;
    if (std::strcmp(v, "avx512") == 0) return IsaCap::Avx512;
    // A warning rather than an error: this is read inside kernels, where an exception cannot be raised.
    std::fprintf(
        stderr,
        "kiln: KILN_CPU_ISA=%s is not a CPU kernel set (expected generic, avx512 or auto); using auto\n", v);
    return IsaCap::Auto;
  }();
  return cap;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
    __builtin_cpu_init();
    f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
    f.fma = __builtin_cpu_supports("fma");
    f.amx_bf16 = detect_amx_bf16();
    return f;
  }();
  return features;
}

bool amx_allowed_by_isa() {
  return isa_cap() == IsaCap::Auto;
}

bool amx_usable() {
  if (!cpu_features().amx_bf16 || !amx_allowed_by_isa()) return false;
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

bool use_avx512() {
  // KILN_CPU_ISA=generic forces the portable kernels, so both variants can be tested on one machine.
  static const bool use = isa_cap() != IsaCap::Generic && cpu_features().avx512 && cpu_features().avx512_bf16;
  return use;
}

const char* cpu_isa_name() {
  return use_avx512() ? "avx512" : "generic";
}

}  // namespace kiln::cpu_kernels
