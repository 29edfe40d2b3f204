// Kiln's own bf16 GEMMs against a float64 reference of the same bf16 operands: the f32-FMA GEMM
// (src/backends/cpu/gemm_fma32.h) in both kernel variants and, where the CPU has AMX, the AMX GEMM
// (gemm_amx.h), over shapes that hit every edge of their blocking (partial register tiles or tiles, K not a
// multiple of the depth block, more rows or columns than one block, M = 1), strided and column-major
// operands, and every epilogue. Then the op tests again on each bf16 path (KILN_CPU_MATMUL), so that every
// path this host can run does, whichever one it picks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/amx_packed_weights.h"
#include "backends/cpu/cpu_features.h"
#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/gemm_fma32.h"
#include "backends/cpu/matmul_path.h"
#include "kiln/core/device_runtime.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using cpu_kernels::Bf16Gemm;

struct Case {
  int64_t m, k, n;
  bool w_column_major = false;  // weight stored as [K, N] and viewed transposed
  bool strided = false;         // x and weight are column slices of wider tensors
  bool x_column_major = false;
};

struct Epi {
  DType bias = DType::Bool;  // Bool: no bias
  Activation act = Activation::None;
  int64_t gate_rows = 0;  // 0: no gate; 1, M or a divisor of M
  bool gate_scalar = false;
  bool residual = false;
  bool add_output = false;  // the output starts with a term to add (a LoRA pair's product)
};

double act_ref(Activation act, double x) {
  switch (act) {
    case Activation::Gelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::GeluTanh:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::Silu:
      return x / (1.0 + std::exp(-x));
    case Activation::None:
      break;
  }
  return x;
}

// A bf16 [rows, cols] view: contiguous, a column slice of a wider tensor, or the transpose of [cols, rows].
Tensor operand(int64_t rows, int64_t cols, bool column_major, bool strided, uint32_t seed) {
  if (column_major) return testing::values({cols, rows}, seed, -1.0, 1.0, bfloat16).transpose(0, 1);
  if (strided) return testing::values({rows, cols + 5}, seed, -1.0, 1.0, bfloat16).narrow(1, 3, cols);
  return testing::values({rows, cols}, seed, -1.0, 1.0, bfloat16);
}

// The GEMM a check runs.
// AmxPrepacked: the AMX GEMM reading the weight's copy packed once (amx_packed_weights.h).
enum class Kernel { Fma32Generic, Fma32Avx512, Amx, AmxPrepacked };
const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::Amx:
      return "amx";
    case Kernel::AmxPrepacked:
      return "amx prepacked";
    case Kernel::Fma32Avx512:
      return "fma32 avx512";
    case Kernel::Fma32Generic:
      break;
  }
  return "fma32 generic";
}

void check(const Case& c, const Epi& e, DType out_dtype, Kernel kernel) {
  SCOPED_TRACE(::testing::Message() << c.m << "x" << c.k << "x" << c.n << " w_cm " << c.w_column_major
                                    << " strided " << c.strided << " x_cm " << c.x_column_major << " bias "
                                    << dtype_name(e.bias) << " act " << static_cast<int>(e.act) << " gate "
                                    << e.gate_rows << (e.gate_scalar ? " scalar" : "") << " residual "
                                    << e.residual << " out " << dtype_name(out_dtype) << " "
                                    << kernel_name(kernel));
  const Tensor x = operand(c.m, c.k, c.x_column_major, c.strided, 1);
  const Tensor w = operand(c.n, c.k, c.w_column_major, c.strided, 2);
  const Tensor bias = e.bias == DType::Bool ? Tensor() : testing::values({c.n}, 3, -1.0, 1.0, e.bias);
  const Tensor gate = e.gate_rows == 0
                          ? Tensor()
                          : testing::values({e.gate_rows, e.gate_scalar ? 1 : c.n}, 4, -2.0, 2.0, bfloat16);
  const Tensor residual = e.residual ? testing::values({c.m, c.n}, 5, -1.0, 1.0, bfloat16) : Tensor();
  const Tensor out = e.add_output ? testing::values({c.m, c.n}, 6, -1.0, 1.0, out_dtype)
                                  : Tensor::empty({c.m, c.n}, out_dtype);
  synchronize();
  const auto prior = e.add_output ? out.to_vector<double>() : std::vector<double>();

  Bf16Gemm g;
  g.x = x.raw_data();
  g.x_row_stride = x.stride(0);
  g.x_col_stride = x.stride(1);
  g.w = w.raw_data();
  g.w_row_stride = w.stride(0);
  g.w_col_stride = w.stride(1);
  g.m = c.m;
  g.k = c.k;
  g.n = c.n;
  g.out = out.raw_data();
  g.out_dtype = out_dtype;
  g.out_row_stride = c.n;
  auto& ep = g.epilogue;
  ep.m = c.m;
  ep.act = e.act;
  ep.add_output = e.add_output;
  if (bias.defined()) {
    ep.bias = bias.raw_data();
    ep.bias_dtype = bias.dtype();
  }
  if (gate.defined()) {
    ep.gate = gate.raw_data();
    ep.gate_dtype = bfloat16;
    ep.gate_rows = gate.size(0);
    ep.gate_cols = gate.size(1);
    ep.gate_row_stride = gate.stride(0);
  }
  if (residual.defined()) {
    ep.residual = residual.raw_data();
    ep.residual_dtype = bfloat16;
    ep.residual_row_stride = c.n;
  }
  if (kernel == Kernel::Amx || kernel == Kernel::AmxPrepacked) {
    ASSERT_TRUE(cpu_kernels::gemm_amx_takes(g));
    if (kernel == Kernel::AmxPrepacked) {
      g.w_amx_tiles = cpu_kernels::amx_packed_weight(w);
      ASSERT_NE(g.w_amx_tiles, nullptr);
      EXPECT_EQ(cpu_kernels::amx_packed_weight(w), g.w_amx_tiles);  // packed once, then found
    }
    cpu_kernels::gemm_amx(g);
  } else {
    cpu_kernels::gemm_fma32(g, kernel == Kernel::Fma32Avx512);
  }

  const auto xv = x.contiguous().to_vector<double>(), wv = w.contiguous().to_vector<double>();
  const auto bv = bias.defined() ? bias.to_vector<double>() : std::vector<double>();
  const auto gv = gate.defined() ? gate.to_vector<double>() : std::vector<double>();
  const auto rv = residual.defined() ? residual.to_vector<double>() : std::vector<double>();
  const auto ov = out.to_vector<double>();
  // The product of bf16 values is exact in float32; what remains is float32 accumulation (about K * 2^-24 of
  // sum |x w| in the worst case, far less in practice), the activations' few ulp, and the output rounding.
  const double out_eps = out_dtype == bfloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -21);
  int bad = 0;
  for (int64_t i = 0; i < c.m && bad < 5; ++i) {
    for (int64_t j = 0; j < c.n && bad < 5; ++j) {
      double acc = 0, mag = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        acc += xv[i * c.k + p] * wv[j * c.k + p];
        mag += std::abs(xv[i * c.k + p] * wv[j * c.k + p]);
      }
      if (!bv.empty()) acc += bv[j];
      if (!prior.empty()) acc += prior[i * c.n + j];
      double v = act_ref(e.act, acc);
      double scale = 1.0;
      if (!gv.empty()) {
        const int64_t row = e.gate_rows == 1 ? 0 : i / (c.m / e.gate_rows);
        scale = gv[row * (e.gate_scalar ? 1 : c.n) + (e.gate_scalar ? 0 : j)];
        v *= scale;
      }
      if (!rv.empty()) v += rv[i * c.n + j];
      const double tol = 4e-7 * (mag + 1.0) * std::abs(scale) * 2 + out_eps * std::abs(v) + 1e-6;
      const double got = ov[i * c.n + j];
      if (!(std::abs(got - v) <= tol)) {
        ADD_FAILURE() << "out[" << i << ", " << j << "] = " << got << ", reference " << v << " (tol " << tol
                      << ")";
        ++bad;
      }
    }
  }
}

std::vector<Kernel> variants() {
  std::vector<Kernel> v{Kernel::Fma32Generic};
  if (cpu_kernels::cpu_features().avx512 && cpu_kernels::cpu_features().avx512_bf16)
    v.push_back(Kernel::Fma32Avx512);
  return v;
}

bool have_amx() {
  return cpu_kernels::cpu_features().avx512 && cpu_kernels::cpu_features().avx512_bf16 &&
         cpu_kernels::amx_usable();
}

TEST(GemmFma32, MatchesFloat64ReferenceOverShapes) {
  const std::vector<Case> cases{
      {1, 1, 1},
      {1, 300, 7},
      {7, 5, 3},
      {13, 257, 49},
      {9, 512, 96},
      {33, 1000, 130},
      {100, 64, 400},
      {2, 3, 1000},
      {2100, 40, 50},
      {17, 600, 97, true},
      {21, 300, 60, false, true},
      {8, 48, 48, false, false, true},
      {5, 777, 33, true, true, true},
  };
  for (Kernel kernel : variants())
    for (const Case& c : cases)
      for (DType out : {bfloat16, float32}) check(c, Epi{}, out, kernel);
}

// The AMX GEMM takes K in multiples of 32: 16-row tiles cut short (M = 1, 7, 13, 17, 33, 2100), 16-column
// groups cut short (N = 1, 3, 49, 97, 130), an odd number of them, K in several depth slices of at most 2048
// with a shorter last one (4160 = 1408 + 1408 + 1344), more rows than one block (2100), strided and
// column-major weights, and an x whose rows do not start on cache lines.
TEST(GemmAmx, MatchesFloat64ReferenceOverShapes) {
  if (!have_amx()) GTEST_SKIP() << "no AMX on this CPU";
  const std::vector<Case> cases{
      {1, 32, 1},
      {7, 64, 3},
      {13, 256, 49},
      {16, 32, 16},
      {32, 64, 32},
      {33, 1056, 130},
      {40, 4160, 48},
      {100, 64, 400},
      {2, 32, 1000},
      {2100, 64, 50},
      {17, 608, 97, true},
      {19, 4160, 20, true},
      {21, 288, 60, false, true},
      {5, 800, 33, true, true},
      // x's rows 2 * (K + 5) bytes apart from 6 bytes past a line: whole 32-row strips are read through the
      // aligned edge buffer too, across depth slices.
      {70, 608, 40, false, true},
      {64, 4160, 33, false, true},
  };
  for (const Case& c : cases)
    for (DType out : {bfloat16, float32})
      for (Kernel kernel : {Kernel::Amx, Kernel::AmxPrepacked}) check(c, Epi{}, out, kernel);
}

TEST(GemmAmx, TakesOnlyWholeTileStepsOfContiguousRows) {
  cpu_kernels::Bf16Gemm g;
  g.m = 64, g.n = 64, g.k = 96, g.x_col_stride = 1;
  EXPECT_TRUE(cpu_kernels::gemm_amx_takes(g));
  g.k = 100;
  EXPECT_FALSE(cpu_kernels::gemm_amx_takes(g));
  g.k = 96, g.x_col_stride = 64;
  EXPECT_FALSE(cpu_kernels::gemm_amx_takes(g));
}

TEST(GemmFma32, EveryEpilogue) {
  const Case c{12, 300, 70};
  std::vector<Epi> epis;
  for (DType bias : {DType::Bool, bfloat16, float32})
    for (Activation act : {Activation::None, Activation::Gelu, Activation::GeluTanh, Activation::Silu})
      epis.push_back({bias, act});
  for (int64_t gate_rows : {1, 3, 12}) {
    epis.push_back({float32, Activation::Gelu, gate_rows, false, true});
    epis.push_back({bfloat16, Activation::Silu, gate_rows, true, false});
  }
  epis.push_back({DType::Bool, Activation::None, 0, false, true});
  epis.push_back({bfloat16, Activation::GeluTanh, 3, false, true, true});
  epis.push_back({DType::Bool, Activation::None, 0, false, false, true});
  for (Kernel kernel : variants())
    for (const Epi& e : epis)
      for (DType out : {bfloat16, float32}) check(c, e, out, kernel);
  if (have_amx()) {
    const Case amx_case{12, 320, 70};
    for (const Epi& e : epis)
      for (DType out : {bfloat16, float32}) check(amx_case, e, out, Kernel::Amx);
  }
}

// Past one depth slice (384 deep on the fma32 path, up to 2048 on AMX), each strip of rows goes through the
// epilogue during the last slice, on the sums of every slice; 45 rows end in a partial strip on both.
TEST(GemmFma32, EveryEpilogueAfterSeveralDepthSlices) {
  std::vector<Epi> epis;
  for (Activation act : {Activation::None, Activation::GeluTanh}) epis.push_back({bfloat16, act});
  epis.push_back({float32, Activation::Gelu, 3, false, true});
  epis.push_back({bfloat16, Activation::Silu, 1, true, false});
  epis.push_back({bfloat16, Activation::GeluTanh, 3, false, true, true});
  for (Kernel kernel : variants())
    for (const Epi& e : epis)
      for (DType out : {bfloat16, float32}) check({45, 800, 70}, e, out, kernel);
  if (have_amx()) {
    for (const Epi& e : epis)
      for (DType out : {bfloat16, float32}) check({45, 4160, 70}, e, out, Kernel::Amx);
  }
}

// The op tests once more in a child process on each bf16 path, forced; every host runs both, and the fma32
// path in the portable kernel variant too.
void rerun_with(const std::string& env) {
  const testing::ChildRun run = testing::run_this_binary(
      env,
      "Linear*:Matmul*:FusedLinear*:LinearFused*:Attention*:GemmFma32*:GemmAmx*:Packed*:QuantizedLinear*:"
      "-Bf16Path*");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("[  PASSED  ]"), std::string::npos) << run.output;
}

TEST(Bf16Path, Fma32PassesTheOpTests) {
  rerun_with("KILN_CPU_MATMUL=fma32");
}

TEST(Bf16Path, Fma32InThePortableVariantPassesTheOpTests) {
  rerun_with("KILN_CPU_ISA=generic KILN_CPU_MATMUL=fma32");
}

TEST(Bf16Path, OnednnPassesTheOpTests) {
  rerun_with("KILN_CPU_MATMUL=onednn");
}

TEST(Bf16Path, AmxPassesTheOpTests) {
  if (!have_amx()) GTEST_SKIP() << "no AMX on this CPU";
  rerun_with("KILN_CPU_MATMUL=amx");
}

// Forcing the amx path where it cannot run is an error naming the variable, not a crash on the first tile.
TEST(Bf16Path, AmxWhereItCannotRunIsAnError) {
  // The portable kernels never run tiles, on any CPU.
  const testing::ChildRun run =
      testing::run_this_binary("KILN_CPU_ISA=generic KILN_CPU_MATMUL=amx", "GemmFma32Op.Bf16Linear");
  EXPECT_NE(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("KILN_CPU_MATMUL=amx"), std::string::npos) << run.output;
}

TEST(Bf16Path, UnknownValueIsAnErrorNamingTheVariable) {
  const testing::ChildRun run = testing::run_this_binary("KILN_CPU_MATMUL=fastest", "GemmFma32Op.Bf16Linear");
  EXPECT_NE(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("KILN_CPU_MATMUL=fastest"), std::string::npos) << run.output;
}

// A bf16 linear through the op on whichever path this process picked (the child of the test above).
TEST(GemmFma32Op, Bf16Linear) {
  const Tensor x = testing::values({5, 40}, 1, -1.0, 1.0, bfloat16);
  const Tensor w = testing::values({24, 40}, 2, -1.0, 1.0, bfloat16);
  const Tensor y = linear(x, w);
  const Tensor ref = matmul(x.to(float32), w.to(float32).transpose(0, 1));
  EXPECT_TRUE(testing::all_close(y.to(float32), ref, 1e-2, 1e-3));
}

}  // namespace
}  // namespace kiln
