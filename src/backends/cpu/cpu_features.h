// What the CPU we run on can do, detected once at run time. Vectorized kernels exist in an AVX-512 build
// and a portable build (src/backends/cpu/isa/); use_avx512() picks between them.
#pragma once

namespace kiln::cpu_kernels {

struct CpuFeatures {
  bool avx512 = false;       // F, BW, VL, DQ
  bool avx512_bf16 = false;  // VDPBF16PS / VCVTNE2PS2BF16
  bool fma = false;
  bool amx_bf16 = false;  // AMX tiles with TDPBF16PS, and the OS saves their state (XCR0 bits 17-18)
};

const CpuFeatures& cpu_features();
// KILN_CPU_ISA sets the most of the CPU a process uses: "generic" (the portable kernels, so that both
// variants can be tested on one machine), "avx512" (the AVX-512 kernels but no AMX tiles, neither Kiln's nor
// oneDNN's: the process runs as on a CPU without AMX, its bf16 path chosen by the probe among the rest), or
// "auto"/unset (all it has). Another value is reported on stderr and taken as auto.
//
// True when this process may run AMX tile instructions: the CPU has them (amx_bf16), KILN_CPU_ISA leaves them
// (amx_allowed_by_isa) and Linux granted the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once per
// process; without it the first tile instruction faults).
bool amx_usable();
// False when KILN_CPU_ISA is "generic" or "avx512".
bool amx_allowed_by_isa();
// True when the AVX-512 kernel variants should run: the CPU has them and KILN_CPU_ISA is not "generic".
bool use_avx512();
// "avx512" or "generic": the variant in use, for logs and benchmark output.
const char* cpu_isa_name();

}  // namespace kiln::cpu_kernels
