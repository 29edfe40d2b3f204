// Which instruction bf16 products run on. oneDNN's bf16 kernels multiply with vdpbf16ps (or AMX tdpbf16ps);
// on a CPU whose f32 FMA outruns vdpbf16ps (Intel Xeons without AMX) the same products are faster as
// float32 FMAs on operands widened exactly from bf16 (a bf16 x bf16 product is exact in float32, so the
// precision is the same); on a CPU with AMX, tiles (TDPBF16PS) outrun both. The choice covers "linear",
// "linear_fused" with bf16 weights (gemm_fma32.h), "linear_quantized"'s expanded bf16 panels
// (quantized_linear.cpp) and attention's two products (attention.cpp).
#pragma once

#include <cstdint>

namespace kiln::cpu_kernels {

enum class Bf16Path {
  Onednn,  // oneDNN bf16 matmuls, attention on vdpbf16ps: the bf16 instructions
  Fma32,   // Kiln's f32-FMA GEMM (gemm_fma32.h), attention in float32
  Amx,     // Kiln's AMX GEMM (gemm_amx.h; oneDNN for the products it does not take), attention on AMX tiles
};

// KILN_CPU_MATMUL=onednn, fma32 or amx forces a path (fma32 also runs on CPUs without AVX-512, in the
// portable kernel variant: slow, but it lets the tests exercise it anywhere; amx is an error where
// amx_usable() is false or the AVX-512 kernels are not in use). Unset or "auto": amx where the AVX-512
// kernels are in use, AMX is usable and TDPBF16PS is this host's fastest instruction; else fma32 where this
// host's f32 FMA rate beats its best bf16 instruction by kFma32Margin (host_instruction_rates(): the probe
// runs once per CPU model); otherwise oneDNN. Any other value is an error naming the variable. Decided once
// per process; KILN_LOG=matmul says which and why.
Bf16Path bf16_path();
const char* bf16_path_name(Bf16Path path);
// True when KILN_CPU_MATMUL or a ScopedBf16Path chose the path rather than the probe.
bool bf16_path_forced();

// Products with fewer rows than this stay on oneDNN on the automatic fma32 path: widening each weight
// element into a panel costs about a cycle, which only kFma32MinRows rows of FMAs (M / 32 cycles per element
// on two FMA units) repay against vdpbf16ps at ~0.6x of FMA (an estimate from this Zen 4 host's packing cost:
// the Intel host was not available). Below it the product is mostly reading the weight, whatever multiplies
// it. A forced fma32 path takes every row count, so that the tests exercise it on every shape.
inline constexpr int64_t kFma32MinRows = 48;

// Products with fewer rows than this stay on oneDNN on the automatic amx path: the AMX GEMM packs the
// weight's tiles on every call (gemm_amx.h), a pass over the weight that a product of few rows does not
// repay; oneDNN reads its own packed copy (or the weight in place). A forced amx path takes every row count.
inline constexpr int64_t kAmxMinRows = 64;

// Overrides bf16_path() for this process while it lives (tests of one path's behaviour, such as oneDNN's
// weight packing, that must hold on every host whichever path it picks). Not for concurrent use with
// products in flight.
class ScopedBf16Path {
 public:
  explicit ScopedBf16Path(Bf16Path path);
  ~ScopedBf16Path();
  ScopedBf16Path(const ScopedBf16Path&) = delete;
  ScopedBf16Path& operator=(const ScopedBf16Path&) = delete;

 private:
  int previous_;
};

// How much faster f32 FMA must be than the best bf16 instruction before the fma32 path wins: oneDNN's bf16
// GEMMs reach a larger share of their instruction's rate than a simpler kernel reaches of FMA's.
inline constexpr double kFma32Margin = 1.15;

}  // namespace kiln::cpu_kernels
