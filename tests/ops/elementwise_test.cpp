// Elementwise ops against PyTorch (tools/kernel_refs/elementwise.py ->
// tests/data/kernels/elementwise.safetensors), plus threading, variant agreement and error cases. The
// reference file is data-driven: each case's metadata spec names the op and its scalar arguments (see the
// script's docstring).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/elementwise_op.h"
#include "backends/cpu/isa_dispatch.h"
#include "kiln/core/device_runtime.h"
#include "kiln/ops/elementwise.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln::cpu_kernels {
KILN_ISA_DECLARE(void, ew_float_run,
                 (EwOp op, const EwParams& params, const EwOperand* inputs, char* out, int64_t out_stride,
                  DType out_dtype, int64_t n));
}  // namespace kiln::cpu_kernels

namespace kiln {
namespace {

using Spec = std::map<std::string, std::string>;

Spec parse_spec(const std::string& text) {
  Spec spec;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ';')) {
    const auto eq = item.find('=');
    spec[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return spec;
}

std::optional<double> number(const Spec& s, const std::string& key) {
  auto it = s.find(key);
  if (it == s.end()) return std::nullopt;
  return std::stod(it->second);
}

Tensor apply(const Spec& s, const Tensor& a, const Tensor& b, const Tensor& c) {
  const std::string& op = s.at("op");
  if (auto scalar = number(s, "scalar")) {
    const double v = *scalar;
    const bool first = s.count("scalar_first") && s.at("scalar_first") == "1";
    if (op == "add") return first ? v + a : a + v;
    if (op == "sub") return first ? v - a : a - v;
    if (op == "mul") return first ? v * a : a * v;
    if (op == "div") return first ? v / a : a / v;
    if (op == "eq") return eq(a, v);
    if (op == "ne") return ne(a, v);
    if (op == "lt") return lt(a, v);
    if (op == "le") return le(a, v);
    if (op == "gt") return gt(a, v);
    if (op == "ge") return ge(a, v);
  }
  static const std::map<std::string, Tensor (*)(const Tensor&)> unary = {
      {"neg", [](const Tensor& x) { return -x; }},
      {"abs", abs},
      {"square", square},
      {"exp", exp},
      {"log", log},
      {"sqrt", sqrt},
      {"rsqrt", rsqrt},
      {"sin", sin},
      {"cos", cos},
      {"tanh", tanh},
      {"sigmoid", sigmoid},
      {"silu", silu},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApproximate::Tanh); }},
      {"quick_gelu", quick_gelu},
  };
  static const std::map<std::string, Tensor (*)(const Tensor&, const Tensor&)> binary = {
      {"add", [](const Tensor& x, const Tensor& y) { return x + y; }},
      {"sub", [](const Tensor& x, const Tensor& y) { return x - y; }},
      {"mul", [](const Tensor& x, const Tensor& y) { return x * y; }},
      {"div", [](const Tensor& x, const Tensor& y) { return x / y; }},
      {"maximum", maximum},
      {"minimum", minimum},
      {"pow", [](const Tensor& x, const Tensor& y) { return pow(x, y); }},
      {"eq", [](const Tensor& x, const Tensor& y) { return eq(x, y); }},
      {"ne", [](const Tensor& x, const Tensor& y) { return ne(x, y); }},
      {"lt", [](const Tensor& x, const Tensor& y) { return lt(x, y); }},
      {"le", [](const Tensor& x, const Tensor& y) { return le(x, y); }},
      {"gt", [](const Tensor& x, const Tensor& y) { return gt(x, y); }},
      {"ge", [](const Tensor& x, const Tensor& y) { return ge(x, y); }},
  };
  if (auto it = unary.find(op); it != unary.end()) return it->second(a);
  if (auto it = binary.find(op); it != binary.end()) return it->second(a, b);
  if (op == "clamp") return clamp(a, number(s, "lo"), number(s, "hi"));
  if (op == "pow_scalar") return pow(a, *number(s, "exponent"));
  if (op == "where") return where(c, a, b);
  ADD_FAILURE() << "unknown op in spec: " << op;
  return a;
}

struct Tolerance {
  double rtol = 0, atol = 0;
};

// Basic arithmetic is correctly rounded in float32 and rounded once more to 16 bits, exactly like torch.
// Kiln's sqrt and its 16-bit pow/rsqrt round once where torch rounds twice (or uses an approximation), and
// transcendental functions may differ from torch's by a few float32 ulp: those get one ulp of the dtype.
Tolerance tolerance_for(const Spec& s, DType out) {
  static const std::set<std::string> exact = {"neg", "abs",     "square",  "add",   "sub",  "mul",
                                              "div", "maximum", "minimum", "eq",    "ne",   "lt",
                                              "le",  "gt",      "ge",      "where", "clamp"};
  const std::string& op = s.at("op");
  const bool reciprocal_div = op == "div" && s.count("scalar_first");  // torch: reciprocal(x) * s
  bool is_exact = exact.count(op) && !reciprocal_div;
  if (op == "pow_scalar") is_exact = *number(s, "exponent") == 2.0;
  if (is_exact) return {0, 0};
  switch (out) {
    case DType::BFloat16:
      return {1.0 / 128, 1e-6};
    case DType::Float16:
      return {1.0 / 1024, 1e-6};
    case DType::Float64:
      return {1e-12, 1e-14};
    default:
      return {2e-6, 1e-6};
  }
}

// The op a case names, by the op table's names.
cpu_kernels::EwOp unary_op(const std::string& op) {
  return runtime::find_ew_op(op).value();
}

// The op of a unary case computed by the portable kernel variant directly, whatever this CPU selects.
Tensor run_generic(const Spec& s, const Tensor& a) {
  cpu_kernels::EwParams params;
  params.lo = number(s, "lo").value_or(-HUGE_VAL);
  params.hi = number(s, "hi").value_or(HUGE_VAL);
  // The front end rounds pow's exponent to the tensor's dtype, as torch does.
  if (auto e = number(s, "exponent")) params.exponent = Tensor::full({1}, *e, a.dtype()).item();
  Tensor y = Tensor::empty(a.shape(), a.dtype());
  const auto size = static_cast<int64_t>(a.element_size());
  const cpu_kernels::EwOperand in{static_cast<const char*>(a.raw_data()), size, a.dtype()};
  cpu_kernels::generic::ew_float_run(unary_op(s.at("op")), params, &in, static_cast<char*>(y.raw_data()),
                                     size, a.dtype(), a.numel());
  return y;
}

class ElementwiseReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    file_ = new io::SafetensorsFile(testing::data_path("kernels/elementwise.safetensors"));
  }
  static void TearDownTestSuite() {
    delete file_;
    file_ = nullptr;
  }

  // Runs every case whose name starts with `prefix`; returns how many ran.
  static int run_cases(const std::string& prefix) {
    int count = 0;
    for (const auto& [name, text] : file_->metadata()) {
      if (name.rfind(prefix, 0) != 0) continue;
      SCOPED_TRACE(name + " {" + text + "}");
      const Spec s = parse_spec(text);
      auto operand = [&](const std::string& key) {
        const std::string stored = s.count(key) ? s.at(key) : name + "." + key;
        return file_->contains(stored) ? file_->tensor(stored) : Tensor();
      };
      Tensor a = operand("a");
      const Tensor b = operand("b"), c = operand("c");
      if (s.count("a_view")) {
        if (s.at("a_view") == "t") a = a.transpose(-1, -2);
        if (s.at("a_view") == "s2") a = a.slice(-1, 0, a.size(-1), 2);
        EXPECT_FALSE(a.is_contiguous());
      }
      const Tensor expected = file_->tensor(name + ".expected");
      const Tensor actual = apply(s, a, b, c);
      EXPECT_EQ(actual.dtype(), expected.dtype())
          << dtype_name(actual.dtype()) << " vs " << dtype_name(expected.dtype());
      const Tolerance tol = tolerance_for(s, expected.dtype());
      EXPECT_TRUE(testing::all_close(actual, expected.to(actual.dtype()), tol.rtol, tol.atol));
      // The op above ran the variant this CPU selects; run the portable one on unary float cases as well.
      if (!b.defined() && !c.defined() && !s.count("scalar") && !s.count("a_view") &&
          a.dtype() == expected.dtype() &&
          (a.dtype() == float32 || a.dtype() == bfloat16 || a.dtype() == float16)) {
        const Tensor generic = run_generic(s, a);
        EXPECT_TRUE(testing::all_close(generic, expected, tol.rtol, tol.atol)) << "portable variant";
      }
      ++count;
    }
    return count;
  }

  static io::SafetensorsFile* file_;
};
io::SafetensorsFile* ElementwiseReference::file_ = nullptr;

TEST_F(ElementwiseReference, UnaryOpsMatchTorch) {
  EXPECT_GE(run_cases("unary."), 59);
}
TEST_F(ElementwiseReference, ClampMatchesTorch) {
  EXPECT_GE(run_cases("clamp."), 11);
}
TEST_F(ElementwiseReference, PowScalarMatchesTorch) {
  EXPECT_GE(run_cases("pow_scalar."), 25);
}
TEST_F(ElementwiseReference, BroadcastBinaryOpsMatchTorch) {
  EXPECT_GE(run_cases("binary."), 72);
}
TEST_F(ElementwiseReference, TypePromotionMatchesTorch) {
  EXPECT_GE(run_cases("promote."), 50);
}
TEST_F(ElementwiseReference, ScalarOperandsMatchTorch) {
  EXPECT_GE(run_cases("scalar."), 80);
}
TEST_F(ElementwiseReference, WhereMatchesTorch) {
  EXPECT_GE(run_cases("where."), 6);
}
TEST_F(ElementwiseReference, NonContiguousInputsMatchTorch) {
  EXPECT_GE(run_cases("view."), 12);
}

// The reference cases above run the variant this CPU selects; rerun them in a child process forced onto the
// portable variant (KILN_CPU_ISA is read once per process).
TEST(ElementwiseIsa, PortableVariantPassesTheReferenceCases) {
  if (!cpu_kernels::use_avx512()) GTEST_SKIP() << "this run already uses the portable variant";
  const testing::ChildRun run =
      testing::run_this_binary("KILN_CPU_ISA=generic", "ElementwiseReference.*:Elementwise.*:VecMath.*");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("[  PASSED  ]"), std::string::npos) << run.output;
}

// ---- threading: a tensor large enough to be split across threads gives the same values as small pieces.
TEST(Elementwise, LargeTensorsSplitAcrossThreadsAgreeWithSmallPieces) {
  const int64_t rows = 96, cols = 3000;  // 288000 elements: parallel; each row alone is below the grain
  std::vector<float> values(rows * cols);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(std::sin(0.37 * i) * 4.0);
  const Tensor x = Tensor::from_vector(values, {rows, cols}).to(bfloat16);
  std::vector<float> sv(cols);
  for (int64_t j = 0; j < cols; ++j) sv[j] = 0.5f + 0.001f * static_cast<float>(j);
  const Tensor scale = Tensor::from_vector(sv, {cols}).to(bfloat16);

  const Tensor whole = gelu(x * scale + 1.0, GeluApproximate::Tanh);
  const Tensor flat_whole = silu(x);
  for (int64_t r = 0; r < rows; r += 17) {
    const Tensor row = x.narrow(0, r, 1);
    EXPECT_TRUE(
        testing::all_close(whole.narrow(0, r, 1), gelu(row * scale + 1.0, GeluApproximate::Tanh), 0, 0));
    EXPECT_TRUE(testing::all_close(flat_whole.narrow(0, r, 1), silu(row), 0, 0));
  }
}

// ---- an operand read across its rows (a permuted view, as SD3's patch embedding adds its position table to
// the convolution's transposed output) is laid out like the output first (tile by tile): the same values as
// the same op on a contiguous copy, for bf16 and float32 operands, with a broadcast operand beside it and a
// transposed pair in a batch.
TEST(Elementwise, TransposedOperandsGiveTheValuesOfContiguousOnes) {
  const int64_t batch = 2, channels = 96, positions = 700;  // 134400 elements per operand: laid out afresh
  std::vector<float> values(batch * channels * positions);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(std::cos(0.11 * i) * 3.0);
  std::vector<float> table(positions * channels);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(std::sin(0.07 * i));
  for (DType dtype : {bfloat16, float32}) {
    const Tensor conv = Tensor::from_vector(values, {batch, channels, positions}).to(dtype);
    const Tensor pos = Tensor::from_vector(table, {1, positions, channels}).to(dtype);
    const Tensor seen = conv.transpose(1, 2);  // [batch, positions, channels], channels `positions` apart
    ASSERT_FALSE(seen.is_contiguous());
    EXPECT_TRUE(testing::all_close(add(seen, pos), add(seen.contiguous(), pos), 0, 0)) << dtype_name(dtype);
    EXPECT_TRUE(testing::all_close(mul(pos, seen), mul(pos, seen.contiguous()), 0, 0)) << dtype_name(dtype);
    EXPECT_TRUE(testing::all_close(silu(seen), silu(seen.contiguous()), 0, 0)) << dtype_name(dtype);
    const Tensor both = add(seen, seen);
    const std::vector<float> got = both.to(float32).to_vector<float>();
    const std::vector<float> from = conv.to(float32).to_vector<float>();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t p = 0; p < positions; p += 7)
        for (int64_t c = 0; c < channels; c += 5)
          ASSERT_EQ(got[(b * positions + p) * channels + c], 2 * from[(b * channels + c) * positions + p])
              << dtype_name(dtype) << " at " << b << ", " << p << ", " << c;
  }
}

// ---- both ISA variants agree: bit for bit on basic arithmetic, within a few float32 ulp elsewhere (the
// AVX-512 build contracts multiply-adds into FMAs).
TEST(Elementwise, IsaVariantsAgree) {
  using namespace cpu_kernels;
  if (!cpu_features().avx512) GTEST_SKIP() << "no AVX-512 on this machine";
  const int64_t n = 1000;  // not a multiple of 16 or of the block size
  std::vector<float> a(n), b(n), cond(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(std::sin(1.3 * i) * (i % 7 == 0 ? 40.0 : 4.0));
    b[i] = static_cast<float>(std::cos(0.7 * i) * 3.0 + 0.1);
    cond[i] = static_cast<float>(i % 3 == 0);
  }
  a[3] = NAN;
  a[5] = INFINITY;
  a[8] = -0.0f;
  const std::vector<EwOp> ops = {
      EwOp::Add,  EwOp::Sub,      EwOp::Mul,       EwOp::Div,    EwOp::Maximum, EwOp::Minimum,  EwOp::Pow,
      EwOp::Eq,   EwOp::Lt,       EwOp::Where,     EwOp::Neg,    EwOp::Abs,     EwOp::Exp,      EwOp::Log,
      EwOp::Sqrt, EwOp::Rsqrt,    EwOp::Sin,       EwOp::Cos,    EwOp::Tanh,    EwOp::Sigmoid,  EwOp::Silu,
      EwOp::Gelu, EwOp::GeluTanh, EwOp::QuickGelu, EwOp::Square, EwOp::Clamp,   EwOp::PowScalar};
  EwParams params;
  params.lo = -1.5;
  params.hi = 2.0;
  params.exponent = 1.3;
  for (DType dt : {float32, bfloat16, float16}) {
    const Tensor ta = Tensor::from_vector(a, {n}).to(dt), tb = Tensor::from_vector(b, {n}).to(dt);
    const Tensor tc = Tensor::from_vector(cond, {n}).to(boolean);
    synchronize();  // the kernels below read raw_data() on this thread: wait for the casts
    for (EwOp op : ops) {
      EwOperand in[3];
      int k = 0;
      if (op == EwOp::Where) in[k++] = {static_cast<const char*>(tc.raw_data()), 1, boolean};
      in[k++] = {static_cast<const char*>(ta.raw_data()), static_cast<int64_t>(ta.element_size()), dt};
      in[k++] = {static_cast<const char*>(tb.raw_data()), static_cast<int64_t>(tb.element_size()), dt};
      const DType out_dt = ew_is_comparison(op) ? boolean : dt;
      Tensor y1 = Tensor::empty({n}, out_dt), y2 = Tensor::empty({n}, out_dt);
      const auto stride = static_cast<int64_t>(y1.element_size());
      generic::ew_float_run(op, params, in, static_cast<char*>(y1.raw_data()), stride, out_dt, n);
      avx512::ew_float_run(op, params, in, static_cast<char*>(y2.raw_data()), stride, out_dt, n);
      const bool arithmetic = op <= EwOp::Where || op == EwOp::Neg || op == EwOp::Abs || op == EwOp::Square ||
                              op == EwOp::Clamp || op == EwOp::Sqrt;
      const double rtol = arithmetic ? 0 : (dt == float32 ? 1e-6 : dt == float16 ? 1.0 / 1024 : 1.0 / 128);
      EXPECT_TRUE(testing::all_close(y2, y1, rtol, arithmetic ? 0 : 1e-7))
          << "op " << static_cast<int>(op) << " dtype " << dtype_name(dt);
    }
  }
}

// ---- errors name the op, the shapes and what was expected
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Elementwise, IncompatibleShapesNameTheOpAndBothShapes) {
  const Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4});
  for (auto [name, fn] : std::vector<std::pair<std::string, Tensor (*)(const Tensor&, const Tensor&)>>{
           {"add", add}, {"mul", mul}, {"maximum", maximum}, {"lt", lt}}) {
    const std::string msg = error_of([&] { fn(a, b); });
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  }
  const std::string msg = error_of([&] { where(Tensor::zeros({5}, boolean), a, Tensor::zeros({3})); });
  EXPECT_NE(msg.find("where"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[5]"), std::string::npos) << msg;
}

TEST(Elementwise, BadDtypesAreRejectedWithTheOpName) {
  const Tensor flags = Tensor::zeros({3}, boolean);
  EXPECT_NE(error_of([&] { sub(flags, flags); }).find("sub"), std::string::npos);
  EXPECT_NE(error_of([&] { neg(flags); }).find("neg"), std::string::npos);
  EXPECT_NE(error_of([&] { pow(flags, flags); }).find("pow"), std::string::npos);
  const std::string msg = error_of([] { where(Tensor::zeros({3}), Tensor::zeros({3}), Tensor::zeros({3})); });
  EXPECT_NE(msg.find("where"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bool"), std::string::npos) << msg;
  EXPECT_NE(error_of([] { clamp(Tensor::zeros({3}), std::nullopt, std::nullopt); }).find("clamp"),
            std::string::npos);
  EXPECT_NE(error_of([] { add(Tensor(), 1.0); }).find("add"), std::string::npos);
}

TEST(Elementwise, ActivationsTendToTheirLimitsAtInfinity) {
  // torch gives NaN for gelu(+-inf) and for x * g(x) activations at -inf; Kiln returns the limits.
  for (DType dt : {float32, bfloat16, float64}) {
    const Tensor x = Tensor::from_vector(std::vector<float>{INFINITY, -INFINITY}, {2}).to(dt);
    for (const Tensor& y : {gelu(x), gelu(x, GeluApproximate::Tanh), silu(x), quick_gelu(x)}) {
      const auto v = y.to_vector<double>();
      EXPECT_EQ(v[0], INFINITY) << dtype_name(dt);
      EXPECT_EQ(v[1], 0.0) << dtype_name(dt);
    }
  }
}

TEST(Elementwise, EmptyTensorsGiveEmptyResults) {
  const Tensor e = Tensor::zeros({0, 5}, bfloat16);
  EXPECT_EQ((e + Tensor::zeros({5}, bfloat16)).shape(), (Shape{0, 5}));
  EXPECT_EQ(gelu(e).numel(), 0);
}

}  // namespace
}  // namespace kiln
