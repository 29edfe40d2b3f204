// The bf16 ceiling of this machine, measured now: register-only loops of every instruction a bf16 product
// can run on (src/backends/cpu/instruction_rates.h: f32 `vfmadd231ps` on exactly widened operands,
// `vdpbf16ps`, AMX `tdpbf16ps` where granted), on every OpenMP thread at once. MFU is reported against the
// fastest of them, never a slower one: on an AMX host the tile rate (issue #12: measuring vdpbf16ps there
// gave MFUs of 300-400%), on an Intel Xeon without AMX the f32 FMA rate (issue #30: vdpbf16ps runs at ~0.6x
// of it there). Measured with wall-clock time, so a busy host lowers it as it lowers the work compared with
// it.
#pragma once

#include <omp.h>

#include <cstdio>
#include <string>

#include "backends/cpu/instruction_rates.h"
#include "backends/cpu/matmul_path.h"

namespace kiln::bench {

struct Bf16Ceiling {
  double gflops = 0;                 // the fastest instruction, all OpenMP threads together; 0 if none
  const char* instruction = "none";  // "tdpbf16ps", "vdpbf16ps" or "vfmadd231ps"
  kiln::cpu_kernels::InstructionRates rates;  // each instruction, all threads together
};

inline Bf16Ceiling measure_bf16_ceiling(double seconds = 0.3) {
  Bf16Ceiling c;
  c.rates = kiln::cpu_kernels::measure_instruction_rates(seconds, true);
  c.gflops = c.rates.best();
  c.instruction = c.rates.best_name();
  return c;
}

// One line for a benchmark's header: each instruction's rate, the best, and the path the bf16 kernels use.
inline void print_ceiling(const Bf16Ceiling& c) {
  const auto path = kiln::cpu_kernels::bf16_path();
  std::printf("ceiling now, %d threads (GFLOP/s): %s; best %s %.0f | bf16 products run on the %s path (%s)\n",
              omp_get_max_threads(), c.rates.describe().c_str(), c.instruction, c.gflops,
              kiln::cpu_kernels::bf16_path_name(path),
              path == kiln::cpu_kernels::Bf16Path::Fma32 ? "f32 FMA on widened bf16"
              : path == kiln::cpu_kernels::Bf16Path::Amx ? "Kiln's AMX GEMM and attention on AMX tiles"
                                                         : "oneDNN bf16");
}

}  // namespace kiln::bench
