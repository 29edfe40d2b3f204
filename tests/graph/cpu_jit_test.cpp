// The CPU JIT for fused elementwise regions: fused results equal the unfused Kiln ops bit for bit, kernels
// are cached by structure and never by scalar values, the on-disk cache serves a second process and rejects
// corrupt or stale entries, and a missing compiler falls back with one warning.
// Each distinct region costs one compile (~1-2 s), so the tests reuse a few regions.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "backends/cpu/cpu_features.h"
#include "graph/cpu_codegen.h"
#include "graph/cpu_jit.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/log.h"
#include "kiln/ops.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln::graph {
namespace {

namespace fs = std::filesystem;

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed, float lo = -4.0f, float hi = 4.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape).to(dtype);
}

// The raw bytes of a tensor's elements in row-major order.
std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const void* p = nullptr;
  switch (c.dtype()) {
    case DType::Float32:
      p = c.data<float>();
      break;
    case DType::BFloat16:
      p = c.data<bf16_t>();
      break;
    case DType::Float16:
      p = c.data<f16_t>();
      break;
    default:
      ADD_FAILURE() << "unexpected dtype";
  }
  const auto* b = static_cast<const unsigned char*>(p);
  return std::vector<unsigned char>(b, b + c.numel() * static_cast<int64_t>(dtype_size(c.dtype())));
}

// Equal bytes, except that any two NaNs match: which NaN an x86 instruction returns depends on its operand
// order, which the compiler may swap for commutative ops, so NaN sign and payload are not reproducible
// between two compilations of the same formula (torch does not specify them either).
bool is_nan_bits(const unsigned char* p, DType d) {
  if (d == DType::Float32) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return (u & 0x7fffffffu) > 0x7f800000u;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return d == DType::BFloat16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}

::testing::AssertionResult bitwise_equal(const Tensor& fused, const Tensor& unfused) {
  if (fused.dtype() != unfused.dtype() || fused.shape() != unfused.shape())
    return ::testing::AssertionFailure() << dtype_name(fused.dtype()) << shape_str(fused.shape()) << " vs "
                                         << dtype_name(unfused.dtype()) << shape_str(unfused.shape());
  const auto a = bytes_of(fused), b = bytes_of(unfused);
  const size_t es = dtype_size(fused.dtype());
  for (size_t i = 0; i < a.size(); i += es) {
    if (std::memcmp(&a[i], &b[i], es) != 0 &&
        !(is_nan_bits(&a[i], fused.dtype()) && is_nan_bits(&b[i], fused.dtype()))) {
      const Tensor fa = fused.to(float32).contiguous(), ua = unfused.to(float32).contiguous();
      return ::testing::AssertionFailure() << "element " << i / es << ": fused " << fa.data<float>()[i / es]
                                           << " != unfused " << ua.data<float>()[i / es];
    }
  }
  return ::testing::AssertionSuccess();
}

ValueId input_of(ElementwiseRegion& r, const Tensor& t) {
  return r.input_like(t.dtype(), t.shape(), t.strides());
}

std::vector<Tensor> empty_outputs(const ElementwiseRegion& r) {
  std::vector<Tensor> outs;
  for (const FusedOutput& o : r.outputs()) outs.push_back(Tensor::empty(r.shape(), o.dtype));
  return outs;
}

JitOptions options_in(const std::string& name) {
  JitOptions o;
  o.cache_dir = testing::temp_dir(name) + "/kernels";
  return o;
}

// Collects warnings while alive.
struct WarningCapture {
  std::vector<std::string> messages;
  WarningHandler previous;
  WarningCapture() {
    previous = set_warning_handler([this](const std::string& m) { messages.push_back(m); });
  }
  ~WarningCapture() { set_warning_handler(previous); }
};

// ---- the IR and its structural key (no compiler involved)

ElementwiseRegion modulate_region(const Shape& shape, DType dtype) {
  // y = x * s0 + s1, the shape of a denoising-step update with run-time scalars.
  ElementwiseRegion r(shape);
  const ValueId x = r.input(dtype, contiguous_strides(shape));
  const ValueId s0 = r.scalar(float32);
  const ValueId s1 = r.scalar(dtype);
  r.output(r.binary(EwOp::Add, r.binary(EwOp::Mul, x, s0, dtype), s1, dtype));
  return r;
}

TEST(FusedRegion, KeyCoversStructureNotScalarValues) {
  const ElementwiseRegion a = modulate_region({4, 33}, bfloat16);
  EXPECT_EQ(a.structural_hash(), modulate_region({4, 33}, bfloat16).structural_hash());
  EXPECT_NE(a.structural_hash(), modulate_region({4, 33}, float32).structural_hash());
  EXPECT_NE(a.structural_hash(), modulate_region({4, 34}, bfloat16).structural_hash());
  // Same shape, different broadcast pattern.
  ElementwiseRegion b({4, 33}), c({4, 33});
  b.output(b.unary(EwOp::Exp, b.input(float32, {33, 1}), float32));
  c.output(c.unary(EwOp::Exp, c.input(float32, {0, 1}), float32));
  EXPECT_NE(b.structural_hash(), c.structural_hash());
  // Different op.
  ElementwiseRegion d({4, 33});
  d.output(d.unary(EwOp::Log, d.input(float32, {33, 1}), float32));
  EXPECT_NE(b.structural_hash(), d.structural_hash());
  // Scalar values never enter the region; only the rounding dtype of each scalar does.
  EXPECT_EQ(a.structural_key().find("0.5"), std::string::npos);
}

TEST(FusedRegion, CanonicalFormMergesContiguousDims) {
  ElementwiseRegion a({2, 64, 3072}), b({393216});
  a.output(a.unary(EwOp::Silu, a.input(bfloat16, contiguous_strides({2, 64, 3072})), bfloat16));
  b.output(b.unary(EwOp::Silu, b.input(bfloat16, {1}), bfloat16));
  EXPECT_EQ(a.canonical().shape(), Shape({393216}));
  EXPECT_EQ(a.structural_key(), b.structural_key());
  // A broadcast over the middle dim stays a dim of its own; size-1 dims vanish.
  ElementwiseRegion c({2, 1, 5, 7});
  const ValueId c0 = c.input(float32, {35, 35, 7, 1});
  const ValueId c1 = c.input(float32, {7, 0, 0, 1});
  c.output(c.binary(EwOp::Add, c0, c1, float32));
  const ElementwiseRegion cc = c.canonical();
  EXPECT_EQ(cc.shape(), Shape({2, 5, 7}));
  EXPECT_EQ(cc.inputs()[0].strides, Strides({35, 7, 1}));
  EXPECT_EQ(cc.inputs()[1].strides, Strides({7, 0, 1}));
}

TEST(FusedRegion, RejectsBadInput) {
  ElementwiseRegion r({3, 4});
  EXPECT_THROW(r.input(int64, {4, 1}), Error);
  EXPECT_THROW(r.input(float32, {1}), Error);  // wrong rank
  const ValueId x = r.input(float32, {4, 1});
  try {
    r.binary(EwOp::Add, x, 7, float32);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused_elementwise"), std::string::npos) << e.what();
  }
  EXPECT_THROW(r.unary(EwOp::Add, x, float32), Error);
  EXPECT_THROW(r.input_like(float32, {5}, {1}), Error);  // does not broadcast to [3, 4]
  EXPECT_THROW(r.clamp(x, -1, -1, float32), Error);
}

TEST(FusedCodegen, SourceIsSelfContainedVectorizedAndParallel) {
  const ElementwiseRegion r = modulate_region({256, 1024}, bfloat16).canonical();
  const std::string src = generate_cpu_source(r, "kiln_fused_test", true);
  EXPECT_EQ(src.find("#include \"kiln/"), std::string::npos);  // the math is embedded, not included
  EXPECT_NE(src.find("inline f32x16 vexp"), std::string::npos);
  EXPECT_NE(src.find("#pragma omp parallel for"), std::string::npos);
  EXPECT_NE(src.find("extern \"C\""), std::string::npos);
  EXPECT_NE(src.find("round_bf16(v"), std::string::npos);  // bf16 intermediates are rounded
}

// ---- fused == unfused, bit for bit

class FusedJit : public ::testing::Test {
 protected:
  void SetUp() override {
    jit_ =
        std::make_unique<CpuJit>(options_in(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    if (!jit_->available()) GTEST_SKIP() << "no C++ compiler on this machine";
  }
  std::unique_ptr<CpuJit> jit_;
};

TEST_F(FusedJit, Bf16AdaLnGeluChainMatchesUnfused) {
  // gelu_tanh(x * (1 + scale) + shift) on bf16 with [B, 1, C] broadcasts and an odd C.
  const Tensor x = random_tensor({2, 7, 67}, bfloat16, 1);
  const Tensor scale = random_tensor({2, 1, 67}, bfloat16, 2, -1, 1);
  const Tensor shift = random_tensor({2, 1, 67}, bfloat16, 3, -1, 1);
  const Tensor expected = gelu(add(mul(x, add(1.0, scale)), shift), GeluApproximate::Tanh);

  ElementwiseRegion r(x.shape());
  const ValueId xv = input_of(r, x), sv = input_of(r, scale), hv = input_of(r, shift);
  const ValueId one = r.scalar(bfloat16);  // add(double, bf16 tensor) rounds the scalar to bf16
  const ValueId t = r.binary(EwOp::Add, one, sv, bfloat16);
  const ValueId u = r.binary(EwOp::Add, r.binary(EwOp::Mul, xv, t, bfloat16), hv, bfloat16);
  r.output(r.unary(EwOp::GeluTanh, u, bfloat16));
  const auto outs = empty_outputs(r);
  ASSERT_TRUE(jit_->run(r, {x, scale, shift}, {1.0}, outs));
  EXPECT_TRUE(bitwise_equal(outs[0], expected));
  EXPECT_EQ(jit_->counters().compiled, 1);
}

TEST_F(FusedJit, F32GatedSigmoidWithNonContiguousInputMatchesUnfused) {
  // (x + a) * sigmoid(b): a broadcast row, b a transposed view, 1000+ elements per row.
  const Tensor x = random_tensor({9, 1031}, float32, 4);
  const Tensor a = random_tensor({1031}, float32, 5);
  const Tensor b = random_tensor({1031, 9}, float32, 6).transpose(0, 1);
  ASSERT_FALSE(b.is_contiguous());
  const Tensor expected = mul(add(x, a), sigmoid(b));

  ElementwiseRegion r(x.shape());
  const ValueId xv = input_of(r, x), av = input_of(r, a), bv = input_of(r, b);
  r.output(r.binary(EwOp::Mul, r.binary(EwOp::Add, xv, av, float32), r.unary(EwOp::Sigmoid, bv, float32),
                    float32));
  const auto outs = empty_outputs(r);
  ASSERT_TRUE(jit_->run(r, {x, a, b}, {}, outs));
  EXPECT_TRUE(bitwise_equal(outs[0], expected));
}

TEST_F(FusedJit, ResidualPlusGateTimesYMixedDtypesWithTwoOutputs) {
  // residual (f32) + gate (bf16, [B, 1, C]) * y (bf16): the product is a bf16 tensor in the unfused chain,
  // then promoted to f32 by the add. The bf16 product is a second output. 4 x 300 x 129 is big enough to
  // run in parallel.
  const Tensor residual = random_tensor({4, 300, 129}, float32, 7);
  const Tensor gate = random_tensor({4, 1, 129}, bfloat16, 8, -2, 2);
  const Tensor y = random_tensor({4, 300, 129}, bfloat16, 9);
  const Tensor prod = mul(gate, y);
  const Tensor expected = add(residual, prod);
  ASSERT_EQ(expected.dtype(), float32);

  ElementwiseRegion r(residual.shape());
  const ValueId rv = input_of(r, residual), gv = input_of(r, gate), yv = input_of(r, y);
  const ValueId p = r.binary(EwOp::Mul, gv, yv, bfloat16);
  r.output(r.binary(EwOp::Add, rv, p, float32));
  r.output(p);
  const auto outs = empty_outputs(r);
  ASSERT_TRUE(jit_->run(r, {residual, gate, y}, {}, outs));
  EXPECT_TRUE(bitwise_equal(outs[0], expected));
  EXPECT_TRUE(bitwise_equal(outs[1], prod));
}

// Every op of the IR in one region (one compile per dtype), on values that include zeros, infinities and
// NaN, against the corresponding unfused op.
void check_every_op(CpuJit& jit, DType dtype) {
  const int64_t n = 203;  // not a multiple of 16
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-12.0f, 12.0f);
  for (float& e : v) e = dist(rng);
  const float inf = std::numeric_limits<float>::infinity();
  v[0] = 0.0f, v[1] = -0.0f, v[2] = inf, v[3] = -inf, v[4] = std::nanf(""), v[5] = 100.0f, v[6] = -100.0f;
  v[7] = 1e-30f;
  const Tensor x = Tensor::from_vector(v, {n}).to(dtype);
  const Tensor z = random_tensor({n}, dtype, 12, 0.5f, 3.0f);

  ElementwiseRegion r({n});
  const ValueId xv = input_of(r, x), zv = input_of(r, z);
  const ValueId lo = r.scalar(float32), hi = r.scalar(float32);
  std::vector<std::pair<std::string, Tensor>> expected;
  auto out_unary = [&](EwOp op, const Tensor& e) {
    r.output(r.unary(op, xv, dtype));
    expected.emplace_back(runtime::ew_op_name(op), e);
  };
  out_unary(EwOp::Neg, neg(x));
  out_unary(EwOp::Abs, abs(x));
  out_unary(EwOp::Exp, exp(x));
  out_unary(EwOp::Log, log(x));
  out_unary(EwOp::Sqrt, sqrt(x));
  out_unary(EwOp::Rsqrt, rsqrt(x));
  out_unary(EwOp::Tanh, tanh(x));
  out_unary(EwOp::Sigmoid, sigmoid(x));
  out_unary(EwOp::Silu, silu(x));
  out_unary(EwOp::Gelu, gelu(x));
  out_unary(EwOp::GeluTanh, gelu(x, GeluApproximate::Tanh));
  out_unary(EwOp::QuickGelu, quick_gelu(x));
  out_unary(EwOp::Square, square(x));
  auto out_binary = [&](EwOp op, const Tensor& e) {
    r.output(r.binary(op, xv, zv, dtype));
    expected.emplace_back(runtime::ew_op_name(op), e);
  };
  out_binary(EwOp::Add, add(x, z));
  out_binary(EwOp::Sub, sub(x, z));
  out_binary(EwOp::Mul, mul(x, z));
  out_binary(EwOp::Div, div(x, z));
  out_binary(EwOp::Maximum, maximum(x, z));
  out_binary(EwOp::Minimum, minimum(x, z));
  r.output(r.clamp(xv, lo, hi, dtype));
  expected.emplace_back("clamp", clamp(x, -2.5, 3.3));
  r.output(r.clamp(xv, -1, hi, dtype));
  expected.emplace_back("clamp(max)", clamp(x, std::nullopt, 3.3));
  // Casts: to each float dtype, and a chain that rounds through bf16 and back.
  for (DType to : {float32, bfloat16, float16}) {
    r.output(r.cast(xv, to));
    expected.emplace_back(std::string("cast to ") + std::string(dtype_name(to)), x.to(to));
  }
  r.output(r.unary(EwOp::Exp, r.cast(xv, bfloat16), bfloat16), float32);
  expected.emplace_back("exp(bf16 cast) in f32", exp(x.to(bfloat16)).to(float32));

  const auto outs = empty_outputs(r);
  ASSERT_TRUE(jit.run(r, {x, z}, {-2.5, 3.3}, outs));
  ASSERT_EQ(outs.size(), expected.size());
  for (size_t i = 0; i < outs.size(); ++i)
    EXPECT_TRUE(bitwise_equal(outs[i], expected[i].second))
        << expected[i].first << " on " << dtype_name(dtype);
}

TEST_F(FusedJit, EveryOpMatchesUnfusedFloat32) {
  check_every_op(*jit_, float32);
}
TEST_F(FusedJit, EveryOpMatchesUnfusedBFloat16) {
  check_every_op(*jit_, bfloat16);
}
TEST_F(FusedJit, EveryOpMatchesUnfusedFloat16) {
  check_every_op(*jit_, float16);
}

TEST_F(FusedJit, RejectsMismatchedTensors) {
  ElementwiseRegion r = modulate_region({4, 33}, float32);
  const Tensor x = random_tensor({4, 33}, float32, 1);
  const Tensor out = Tensor::empty({4, 33}, float32);
  EXPECT_THROW(jit_->run(r, {x.to(bfloat16)}, {1, 2}, {out}), Error);        // input dtype
  EXPECT_THROW(jit_->run(r, {x}, {1}, {out}), Error);                        // scalar count
  EXPECT_THROW(jit_->run(r, {x}, {1, 2}, {Tensor::empty({4, 34})}), Error);  // output shape
  EXPECT_THROW(jit_->run(r, {x.transpose(0, 1).contiguous().transpose(0, 1)}, {1, 2}, {out}),
               Error);                      // strides
  EXPECT_EQ(jit_->counters().compiled, 0);  // all rejected before compiling
}

// ---- caching

TEST_F(FusedJit, ScalarValuesDoNotRecompile) {
  const ElementwiseRegion r = modulate_region({3, 50}, bfloat16);
  const Tensor x = random_tensor({3, 50}, bfloat16, 21);
  for (const auto& [s0, s1] : {std::pair{0.5, 0.25}, std::pair{0.97, -1.3}, std::pair{-3.0, 1e-3}}) {
    const auto outs = empty_outputs(r);
    ASSERT_TRUE(jit_->run(r, {x}, {s0, s1}, outs));
    EXPECT_TRUE(bitwise_equal(outs[0], add(mul(x, s0), s1))) << s0 << ", " << s1;
  }
  const JitCounters c = jit_->counters();
  EXPECT_EQ(c.compiled, 1);
  EXPECT_EQ(c.memory_hits, 2);
  EXPECT_EQ(c.disk_misses, 1);
  EXPECT_EQ(c.disk_hits, 0);
}

TEST_F(FusedJit, SecondProcessLoadsFromDisk) {
  const ElementwiseRegion r = modulate_region({5, 40}, float32);
  const Tensor x = random_tensor({5, 40}, float32, 31);
  auto outs = empty_outputs(r);
  ASSERT_TRUE(jit_->run(r, {x}, {2.0, 1.0}, outs));
  EXPECT_EQ(jit_->counters().compiled, 1);

  // A fresh instance on the same folder is what a new process sees.
  CpuJit second(JitOptions{.cache_dir = jit_->cache_dir()});
  outs = empty_outputs(r);
  ASSERT_TRUE(second.run(r, {x}, {0.5, -1.0}, outs));
  EXPECT_TRUE(bitwise_equal(outs[0], add(mul(x, 0.5), -1.0)));
  EXPECT_EQ(second.counters().compiled, 0);
  EXPECT_EQ(second.counters().disk_hits, 1);

  // Clearing the in-memory cache behaves the same way.
  jit_->clear_memory_cache();
  ASSERT_TRUE(jit_->run(r, {x}, {2.0, 1.0}, outs));
  EXPECT_EQ(jit_->counters().compiled, 1);
  EXPECT_EQ(jit_->counters().disk_hits, 1);
}

std::vector<fs::path> files_with_extension(const std::string& dir, const std::string& ext) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ext) found.push_back(e.path());
  return found;
}

TEST_F(FusedJit, CorruptOrStaleCacheEntryIsRebuilt) {
  const ElementwiseRegion r = modulate_region({6, 30}, float32);
  const Tensor x = random_tensor({6, 30}, float32, 41);
  auto outs = empty_outputs(r);
  ASSERT_TRUE(jit_->run(r, {x}, {2.0, 1.0}, outs));
  const auto sos = files_with_extension(jit_->cache_dir(), ".so");
  ASSERT_EQ(sos.size(), 1u);
  ASSERT_EQ(files_with_extension(jit_->cache_dir(), ".meta").size(), 1u);
  // No build folders or temporary files are left behind.
  for (const auto& e : fs::directory_iterator(jit_->cache_dir()))
    EXPECT_TRUE(e.path().extension() == ".so" || e.path().extension() == ".meta") << e.path();

  // 1. Flip bytes in the middle of the .so: detected by the checksum, rebuilt, and then trusted again.
  {
    std::fstream f(sos[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(sos[0]) / 2));
    f.write("CORRUPT!", 8);
  }
  CpuJit second(JitOptions{.cache_dir = jit_->cache_dir()});
  outs = empty_outputs(r);
  ASSERT_TRUE(second.run(r, {x}, {3.0, -2.0}, outs));
  EXPECT_TRUE(bitwise_equal(outs[0], add(mul(x, 3.0), -2.0)));
  EXPECT_EQ(second.counters().disk_rejected, 1);
  EXPECT_EQ(second.counters().compiled, 1);
  CpuJit third(JitOptions{.cache_dir = jit_->cache_dir()});
  ASSERT_TRUE(third.run(r, {x}, {3.0, -2.0}, outs));
  EXPECT_EQ(third.counters().disk_hits, 1);
  EXPECT_EQ(third.counters().compiled, 0);

  // 2. Truncate it.
  fs::resize_file(sos[0], fs::file_size(sos[0]) / 3);
  CpuJit fourth(JitOptions{.cache_dir = jit_->cache_dir()});
  ASSERT_TRUE(fourth.run(r, {x}, {3.0, -2.0}, outs));
  EXPECT_EQ(fourth.counters().disk_rejected, 1);
  EXPECT_EQ(fourth.counters().compiled, 1);

  // 3. A .meta written for another key (another compiler or Kiln version under a colliding name).
  const auto metas = files_with_extension(jit_->cache_dir(), ".meta");
  std::string meta;
  {
    std::ifstream f(metas[0], std::ios::binary);
    meta.assign(std::istreambuf_iterator<char>(f), {});
  }
  const size_t at = meta.find("compiler=");
  ASSERT_NE(at, std::string::npos);
  meta.insert(at + 9, "other ");
  {
    std::ofstream f(metas[0], std::ios::binary | std::ios::trunc);
    f << meta;
  }
  CpuJit fifth(JitOptions{.cache_dir = jit_->cache_dir()});
  ASSERT_TRUE(fifth.run(r, {x}, {3.0, -2.0}, outs));
  EXPECT_EQ(fifth.counters().disk_rejected, 1);
  EXPECT_EQ(fifth.counters().compiled, 1);
  EXPECT_TRUE(bitwise_equal(outs[0], add(mul(x, 3.0), -2.0)));
}

TEST(FusedJitFallback, MissingCompilerWarnsOnceAndFallsBack) {
  const char* old = std::getenv("CXX");
  const std::string saved = old ? old : "";
  setenv("CXX", "/nonexistent/c++", 1);
  WarningCapture warnings;
  CpuJit jit(options_in("no_compiler"));
  if (old)
    setenv("CXX", saved.c_str(), 1);
  else
    unsetenv("CXX");

  const ElementwiseRegion r = modulate_region({4, 33}, float32);
  const Tensor x = random_tensor({4, 33}, float32, 1);
  const auto outs = empty_outputs(r);
  EXPECT_FALSE(jit.available());
  EXPECT_EQ(jit.kernel(r), nullptr);
  EXPECT_FALSE(jit.run(r, {x}, {1.0, 2.0}, outs));
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("/nonexistent/c++"), std::string::npos) << warnings.messages[0];
  EXPECT_NE(warnings.messages[0].find("unfused"), std::string::npos) << warnings.messages[0];
  EXPECT_EQ(jit.counters().fallbacks, 2);
  EXPECT_EQ(jit.counters().compiled, 0);
}

TEST(FusedJitIsa, GenericVariantMatchesGenericUnfusedKernels) {
  // The portable kernels: bit-identical to the unfused ops when those run portable too
  // (KILN_CPU_ISA=generic), within a few ulp of the AVX-512 ones otherwise.
  JitOptions o = options_in("generic_isa");
  o.isa = 0;
  CpuJit jit(o);
  if (!jit.available()) GTEST_SKIP() << "no C++ compiler on this machine";
  const Tensor x = random_tensor({3, 45}, float32, 51);
  ElementwiseRegion r(x.shape());
  r.output(r.unary(EwOp::Silu, r.unary(EwOp::Tanh, input_of(r, x), float32), float32));
  const auto outs = empty_outputs(r);
  ASSERT_TRUE(jit.run(r, {x}, {}, outs));
  const Tensor expected = silu(tanh(x));
  if (!cpu_kernels::use_avx512())
    EXPECT_TRUE(bitwise_equal(outs[0], expected));
  else
    EXPECT_TRUE(testing::all_close(outs[0], expected, 1e-6, 1e-7));
}

}  // namespace
}  // namespace kiln::graph

namespace kiln::graph {
namespace {

// Not run by default (timing on a shared host): --gtest_also_run_disabled_tests --gtest_filter='*Timing*'.
// The adaLN-style bf16 chain gelu_tanh(x * (1 + scale) + shift) on [1, 4096, 3072], fused vs unfused.
TEST(FusedJitTiming, DISABLED_AdaLnChainFusedVsUnfused) {
  CpuJit jit(options_in("timing"));
  if (!jit.available()) GTEST_SKIP() << "no C++ compiler on this machine";
  const Tensor x = random_tensor({1, 4096, 3072}, bfloat16, 1);
  const Tensor scale = random_tensor({1, 1, 3072}, bfloat16, 2, -1, 1);
  const Tensor shift = random_tensor({1, 1, 3072}, bfloat16, 3, -1, 1);
  ElementwiseRegion r(x.shape());
  const ValueId xv = input_of(r, x), sv = input_of(r, scale), hv = input_of(r, shift);
  const ValueId t = r.binary(EwOp::Add, r.scalar(bfloat16), sv, bfloat16);
  r.output(r.unary(EwOp::GeluTanh, r.binary(EwOp::Add, r.binary(EwOp::Mul, xv, t, bfloat16), hv, bfloat16),
                   bfloat16));
  const auto outs = empty_outputs(r);
  auto time_ms = [](auto&& fn) {
    fn();
    double best = 1e30;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      best = std::min(
          best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  Tensor expected;
  const double unfused = time_ms([&] {
    expected = gelu(add(mul(x, add(1.0, scale)), shift), GeluApproximate::Tanh);
    synchronize(cpu);
  });
  const double fused = time_ms([&] { ASSERT_TRUE(jit.run(r, {x, scale, shift}, {1.0}, outs)); });
  EXPECT_TRUE(bitwise_equal(outs[0], expected));
  std::printf(
      "adaLN gelu_tanh chain bf16 [4096, 3072]: unfused %.2f ms, fused %.2f ms (%.2fx), fused %.1f GB/s\n",
      unfused, fused, unfused / fused, 2.0 * 4096 * 3072 * 2 / (fused * 1e6));
}

}  // namespace
}  // namespace kiln::graph
