// How fast this CPU multiplies on each instruction a bf16 product can run on: register-only loops of AVX-512
// `vfmadd231ps` (float32, after widening bf16 exactly), `vdpbf16ps` (bf16 pairs into float32) and AMX
// `tdpbf16ps` where the CPU and the OS grant the tiles. Which is fastest depends on the host: about 2x
// vdpbf16ps over f32 FMA on AMD Zen 4/5, the reverse (~0.6x) on Intel Xeons without AMX, and AMX far ahead
// where it exists. The bf16 matmul path (matmul_path.h) and the benchmarks' MFU both use the fastest.
#pragma once

#include <string>

namespace kiln::cpu_kernels {

// GFLOP/s of one core on each instruction; 0 where the CPU (or the OS, for AMX) does not offer it.
struct InstructionRates {
  double fma32 = 0;    // vfmadd231ps zmm: 16 lanes x 2 FLOP
  double dpbf16 = 0;   // vdpbf16ps zmm: 16 lanes x 2 products x 2 FLOP
  double tdpbf16 = 0;  // tdpbf16ps: 16x16 float32 += 16x32 by 32x16 bf16, 16384 FLOP

  // The fastest instruction and its rate; "none" and 0 when there is none.
  const char* best_name() const;
  double best() const;
  // "vfmadd231ps 220.1, vdpbf16ps 410.3, tdpbf16ps n/a" (GFLOP/s, scaled by `cores`).
  std::string describe(int cores = 1) const;
};

// Measures each instruction for about `seconds`: on the calling thread, against its CPU time, the best of
// several interleaved rounds (what one core does, whatever else the host runs), or on every OpenMP thread at
// once against the wall clock (`all_threads`, summed: what the cores deliver together at this moment, on a
// shared host less than quiet).
InstructionRates measure_instruction_rates(double seconds, bool all_threads);

// This host's per-core rates, measured once (0.05 s of CPU time per instruction, on the calling thread) and
// kept per CPU model in `instruction_rates_cache_path()` so that later processes read them instead. An
// unwritable or unreadable cache only means measuring again.
const InstructionRates& host_instruction_rates();

// Vendor, brand string, family/model/stepping and the bf16 features this process may use (AMX only where
// amx_usable()): what the cached rates belong to.
std::string cpu_model_key();
// KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln, then "cpu-rates-<model key>.txt"; empty
// when none of those is set.
std::string instruction_rates_cache_path();

// The cache file's text and its reader (exposed for tests). parse returns false on anything malformed or
// written for another CPU model.
std::string format_instruction_rates(const std::string& key, const InstructionRates& r);
bool parse_instruction_rates(const std::string& text, const std::string& key, InstructionRates& out);

}  // namespace kiln::cpu_kernels
