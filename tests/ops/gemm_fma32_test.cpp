// The f32-FMA GEMM (src/backends/cpu/gemm_fma32.h) against a float64 reference of the same bf16 operands,
// in both kernel variants, over shapes that hit every edge of its blocking (partial register tiles, K not a
// multiple of the depth block, more rows or columns than one block, M = 1), strided and column-major
// operands, and every epilogue. Then the op tests again on each bf16 path (KILN_CPU_MATMUL), so that both run
// on every host whichever one it picks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/gemm_fma32.h"
#include "backends/cpu/matmul_path.h"
#include "kiln/core/device_runtime.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using cpu_kernels::Fma32Gemm;

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

void check(const Case& c, const Epi& e, DType out_dtype, bool avx512) {
  SCOPED_TRACE(::testing::Message() << c.m << "x" << c.k << "x" << c.n << " w_cm " << c.w_column_major
                                    << " strided " << c.strided << " x_cm " << c.x_column_major << " bias "
                                    << dtype_name(e.bias) << " act " << static_cast<int>(e.act) << " gate "
                                    << e.gate_rows << (e.gate_scalar ? " scalar" : "") << " residual "
                                    << e.residual << " out " << dtype_name(out_dtype) << " avx512 "
                                    << avx512);
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

  Fma32Gemm g;
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
  cpu_kernels::gemm_fma32(g, avx512);

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

std::vector<bool> variants() {
  std::vector<bool> v{false};
  if (cpu_kernels::cpu_features().avx512 && cpu_kernels::cpu_features().avx512_bf16) v.push_back(true);
  return v;
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
  for (bool avx512 : variants())
    for (const Case& c : cases)
      for (DType out : {bfloat16, float32}) check(c, Epi{}, out, avx512);
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
  for (bool avx512 : variants())
    for (const Epi& e : epis)
      for (DType out : {bfloat16, float32}) check(c, e, out, avx512);
}

// The op tests once more in a child process on each bf16 path, forced; every host runs both, and the fma32
// path in the portable kernel variant too.
void rerun_with(const std::string& env, const std::string& name) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string log = testing::temp_dir("bf16_path_" + name) + "/log.txt";
  const std::string cmd = env + " '" + self +
                          "' --gtest_filter='Linear*:Matmul*:FusedLinear*:LinearFused*:Attention*:GemmFma32*:"
                          "Packed*:-Bf16Path*' > '" +
                          log + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream out;
  out << in.rdbuf();
  EXPECT_EQ(rc, 0) << out.str();
  EXPECT_NE(out.str().find("[  PASSED  ]"), std::string::npos) << out.str();
}

TEST(Bf16Path, Fma32PassesTheOpTests) {
  rerun_with("KILN_CPU_MATMUL=fma32", "fma32");
}

TEST(Bf16Path, Fma32InThePortableVariantPassesTheOpTests) {
  rerun_with("KILN_CPU_ISA=generic KILN_CPU_MATMUL=fma32", "fma32_generic");
}

TEST(Bf16Path, OnednnPassesTheOpTests) {
  rerun_with("KILN_CPU_MATMUL=onednn", "onednn");
}

TEST(Bf16Path, UnknownValueIsAnErrorNamingTheVariable) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string log = testing::temp_dir("bf16_path_bad") + "/log.txt";
  const std::string cmd =
      "KILN_CPU_MATMUL=fastest '" + self + "' --gtest_filter='GemmFma32Op.Bf16Linear' > '" + log + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream out;
  out << in.rdbuf();
  EXPECT_NE(rc, 0) << out.str();
  EXPECT_NE(out.str().find("KILN_CPU_MATMUL=fastest"), std::string::npos) << out.str();
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
