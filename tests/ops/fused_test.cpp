// linear_fused and norm_modulate against the unfused chains of Kiln ops they replace (those ops are
// checked against PyTorch in linalg_test.cpp, elementwise_test.cpp and norm_test.cpp).
//
// Tolerances:
//  * float32: both compute in float32; they differ by float32 rounding (accumulation order of the product,
//    oneDNN's erf/tanh/exp in its post-ops against vec.h's): all_close with rtol 1e-5, atol 1e-5 * max|e|.
//  * bfloat16: the unfused chain rounds every intermediate to bfloat16 (up to 2^-9 relative each, four
//    times), the fused op rounds once: rtol 2^-6 and atol 2^-6 * max|e| (several bf16 ulps; the atol covers
//    outputs that cancel, e.g. residual + gated term near zero). The stricter check: against float32 math on
//    the same bfloat16 inputs, the fused result is within one bfloat16 ulp (rtol 2^-8, atol 2^-8 * max|e|
//    for the product's float32 summation order), which the unfused chain is not required to meet.
//  * float16 (computed in float32, rounded once): against float32 math on the same inputs within one f16
//    ulp (rtol 2^-10, atol 2^-10 * max|e|).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/fused_kernels.h"
#include "backends/cpu/matmul_path.h"
#include "kiln/core/device_runtime.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::values;

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

::testing::AssertionResult close(const Tensor& actual, const Tensor& expected, double tol) {
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(actual.dtype()) << " != expected " << dtype_name(expected.dtype());
  return testing::all_close(actual.to(float32), expected.to(float32), tol, tol * max_abs(expected));
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Tensor activate(const Tensor& v, Activation act) {
  switch (act) {
    case Activation::None:
      return v;
    case Activation::Gelu:
      return gelu(v);
    case Activation::GeluTanh:
      return gelu(v, GeluApproximate::Tanh);
    case Activation::Silu:
      return silu(v);
  }
  return v;
}

// The chain linear_fused replaces, op by op in the inputs' dtype.
Tensor linear_unfused(const Tensor& x, const Tensor& w, const Tensor& bias, const LinearEpilogue& e) {
  Tensor v = activate(linear(x, w, bias), e.act);
  if (e.gate.defined()) v = mul(e.gate, v);
  if (e.residual.defined()) v = add(e.residual, v);
  return v;
}

// The same chain in float32 on the same (already rounded) values, rounded once to `dtype`.
Tensor linear_float_then_round(const Tensor& x, const Tensor& w, const Tensor& bias, const LinearEpilogue& e,
                               DType dtype) {
  LinearEpilogue f{e.act, e.gate.defined() ? e.gate.to(float32) : Tensor(),
                   e.residual.defined() ? e.residual.to(float32) : Tensor()};
  return linear_unfused(x.to(float32), w.to(float32), bias.defined() ? bias.to(float32) : Tensor(), f)
      .to(dtype);
}

struct LinearCase {
  Shape x_shape;
  int64_t n;
  bool bias;
  Shape gate_shape;  // empty: no gate
  bool residual;
};

const Activation kActivations[] = {Activation::None, Activation::Gelu, Activation::GeluTanh,
                                   Activation::Silu};

const char* act_name(Activation a) {
  switch (a) {
    case Activation::None:
      return "none";
    case Activation::Gelu:
      return "gelu";
    case Activation::GeluTanh:
      return "gelu_tanh";
    case Activation::Silu:
      return "silu";
  }
  return "?";
}

// Odd sizes everywhere; gates of every broadcast kind: adaLN's [B, 1, N] with row blocks long enough for
// one call per block (S = 37) and too short (S = 5, materialised), [N], [1, N], per-row [B, S, 1], full,
// scalar-like [1, 1, 1]; 2-D and 4-D x.
const std::vector<LinearCase> kLinearCases = {
    {{2, 37, 45}, 33, true, {2, 1, 33}, true},      {{3, 5, 19}, 17, true, {3, 1, 17}, true},
    {{1, 21, 64}, 48, false, {48}, false},          {{2, 20, 31}, 40, true, {1, 40}, true},
    {{2, 18, 30}, 7, true, {2, 18, 1}, false},      {{2, 9, 16}, 24, false, {2, 9, 24}, true},
    {{3, 17, 29}, 35, true, {1, 1, 1}, true},       {{41, 23}, 13, true, {}, true},
    {{2, 2, 17, 9}, 11, true, {2, 1, 1, 11}, true}, {{1, 16}, 5, true, {5}, true},
};

void run_linear_case(const LinearCase& c, DType dtype, Activation act, uint32_t seed) {
  const int64_t k = c.x_shape.back();
  Shape out_shape = c.x_shape;
  out_shape.back() = c.n;
  const Tensor x = values(c.x_shape, seed, -1, 1, dtype);
  const Tensor w = values({c.n, k}, seed + 1, -0.3, 0.3, dtype);
  const Tensor bias = c.bias ? values({c.n}, seed + 2, -0.5, 0.5, dtype) : Tensor();
  LinearEpilogue e{act, c.gate_shape.empty() ? Tensor() : values(c.gate_shape, seed + 3, -2, 2, dtype),
                   c.residual ? values(out_shape, seed + 4, -1, 1, dtype) : Tensor()};
  const Tensor fused = linear_fused(x, w, bias, e);
  ASSERT_EQ(fused.shape(), out_shape);
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + act_name(act) + " x " + shape_str(c.x_shape) +
               " gate " + shape_str(c.gate_shape));
  if (dtype == float32) {
    EXPECT_TRUE(close(fused, linear_unfused(x, w, bias, e), 1e-5));
  } else if (dtype == bfloat16) {
    EXPECT_TRUE(close(fused, linear_unfused(x, w, bias, e), 0x1p-6));
    EXPECT_TRUE(close(fused, linear_float_then_round(x, w, bias, e, dtype), 0x1p-8));
  } else {
    EXPECT_TRUE(close(fused, linear_float_then_round(x, w, bias, e, dtype), 0x1p-10));
  }
}

// A [1, N] bias and a [1, N] gate have the same oneDNN description: a product with a bias and a residual and
// one with a gate and a residual, of equal shapes, are two primitives (a LoRA adapter's residual made the
// first kind common and once ran the second on the first's primitive).
TEST(LinearFused, BiasAndGateOfOneRowAreDifferentPrimitives) {
  const Tensor x = values({32, 32}, 1), w = values({32, 32}, 2), residual = values({32, 32}, 3);
  const Tensor bias = values({32}, 4), gate = values({1, 32}, 5);
  const Tensor with_bias = linear_fused(x, w, bias, {.residual = residual});
  EXPECT_TRUE(close(with_bias, add(residual, linear(x, w, bias)), 1e-5));
  const Tensor with_gate = linear_fused(x, w, Tensor(), {.gate = gate, .residual = residual});
  EXPECT_TRUE(close(with_gate, add(residual, mul(gate, linear(x, w))), 1e-5));
}

TEST(FusedLinear, MatchesUnfusedChainFloat32) {
  uint32_t seed = 1;
  for (const LinearCase& c : kLinearCases)
    for (Activation act : kActivations) run_linear_case(c, float32, act, seed++);
}

TEST(FusedLinear, MatchesUnfusedChainBFloat16) {
  uint32_t seed = 100;
  for (const LinearCase& c : kLinearCases)
    for (Activation act : kActivations) run_linear_case(c, bfloat16, act, seed++);
}

TEST(FusedLinear, Float16ComputedInFloat32) {
  uint32_t seed = 200;
  for (const LinearCase& c : kLinearCases) run_linear_case(c, float16, Activation::GeluTanh, seed++);
}

TEST(FusedLinear, UnpackedWeightsAndNonContiguousOperands) {
  const WeightPrepacking before = weight_prepacking();
  for (WeightPrepacking policy : {WeightPrepacking::Never, WeightPrepacking::Always}) {
    set_weight_prepacking(policy);
    for (DType dtype : {float32, bfloat16}) {
      // x as a transposed view, w as a slice of a wider matrix, residual as a transposed view.
      const Tensor x = values({29, 2, 37}, 7, -1, 1, dtype).permute({1, 2, 0});  // [2, 37, 29]
      const Tensor w = values({21, 40}, 8, -0.3, 0.3, dtype).narrow(1, 3, 29);
      const Tensor bias = values({21}, 9, -0.5, 0.5, float32);  // float32 bias with any x
      LinearEpilogue e{Activation::Silu, values({2, 1, 21}, 10, -2, 2, dtype),
                       values({2, 21, 37}, 11, -1, 1, dtype).transpose(1, 2)};
      SCOPED_TRACE(std::string(dtype_name(dtype)) +
                   (policy == WeightPrepacking::Never ? " in place" : " packed"));
      const Tensor fused = linear_fused(x, w, bias, e);
      EXPECT_TRUE(
          close(fused, linear_float_then_round(x, w, bias, e, dtype), dtype == float32 ? 1e-5 : 0x1p-8));
    }
  }
  set_weight_prepacking(before);
}

// adaLN's parameters arrive as slices of one [B, 6 C] embedding (emb.chunk(6, dim=1)), unsqueezed to
// [B, 1, C]: strided views, used without the caller making them contiguous.
TEST(FusedLinear, GateAsAStridedSliceOfTheModulationEmbedding) {
  for (DType dtype : {float32, bfloat16}) {
    const Tensor emb = values({2, 6 * 24}, 3, -1, 1, dtype);
    const Tensor gate = emb.narrow(1, 2 * 24, 24).unsqueeze(1);  // [2, 1, 24], row stride 144
    const Tensor x = values({2, 19, 30}, 4, -1, 1, dtype);
    const Tensor w = values({24, 30}, 5, -0.3, 0.3, dtype);
    const LinearEpilogue e{Activation::GeluTanh, gate, values({2, 19, 24}, 6, -1, 1, dtype)};
    EXPECT_TRUE(close(linear_fused(x, w, {}, e), linear_float_then_round(x, w, {}, e, dtype),
                      dtype == float32 ? 1e-5 : 0x1p-8))
        << dtype_name(dtype);
  }
}

TEST(FusedLinear, EmptyInnerDimensionIsTheEpilogueOfTheBias) {
  const Tensor x = Tensor::zeros({2, 3, 0}, float32);
  const Tensor w = Tensor::zeros({4, 0}, float32);
  const Tensor bias = values({4}, 1);
  LinearEpilogue e{Activation::Gelu, values({2, 1, 4}, 2), values({2, 3, 4}, 3)};
  EXPECT_TRUE(close(linear_fused(x, w, bias, e), add(e.residual, mul(e.gate, gelu(bias))), 1e-6));
  EXPECT_EQ(linear_fused(Tensor::zeros({0, 5}, float32), values({4, 5}, 4), {}, {}).shape(), (Shape{0, 4}));
}

// The fused op finds the weight copy "linear" packed (and vice versa): a weight is never packed twice.
// Resident bytes are compared between points reached by the same last op (the stream may keep its last
// call's operands until the next one) after synchronising.
TEST(FusedLinear, SharesThePackedWeightWithLinear) {
  // Packing is the oneDNN path's: on a host whose bf16 products run on f32 FMA (matmul_path.h) it is unused.
  const cpu_kernels::ScopedBf16Path onednn_path(cpu_kernels::Bf16Path::Onednn);
  const WeightPrepacking before = weight_prepacking();
  set_weight_prepacking(WeightPrepacking::Always);
  const Tensor x = values({2, 40, 96}, 1, -1, 1, bfloat16);
  const LinearEpilogue e{Activation::GeluTanh, values({2, 1, 80}, 2, -1, 1, bfloat16),
                         values({2, 40, 80}, 3, -1, 1, bfloat16)};
  const Tensor anchor_w = values({80, 96}, 4, -0.3, 0.3, bfloat16);
  // Runs `f`, then the same anchor product, and returns the resident bytes.
  // Each result is synchronised while alive: in DeferAndFuse mode an unread result is never computed.
  const auto resident_after = [&](auto f) {
    {
      const Tensor y = f();
      synchronize();
    }
    {
      const Tensor y = linear(x, anchor_w);
      synchronize();
    }
    synchronize();
    return counters().memory_of(cpu).current_bytes;
  };
  const int64_t packed_bytes = 80 * 96 * 2;  // at least the bf16 weight's size in any layout
  const Tensor w1 = values({80, 96}, 5, -0.3, 0.3, bfloat16);
  const Tensor w2 = values({80, 96}, 6, -0.3, 0.3, bfloat16);
  const int64_t base = resident_after([] { return Tensor(); });
  const int64_t linear_packed = resident_after([&] { return linear(x, w1); });
  EXPECT_GE(linear_packed - base, packed_bytes);  // the measurement sees a packed copy
  EXPECT_EQ(resident_after([&] { return linear_fused(x, w1, {}, e); }), linear_packed)
      << "linear_fused packed a weight that linear had packed";
  const int64_t fused_packed = resident_after([&] { return linear_fused(x, w2, {}, e); });
  EXPECT_GE(fused_packed - linear_packed, packed_bytes);
  EXPECT_EQ(resident_after([&] { return linear(x, w2); }), fused_packed)
      << "linear packed a weight that linear_fused had packed";
  set_weight_prepacking(before);
}

// A LoRA adapter's low-rank pair added to the product before the epilogue: against the chain
// act(linear(x, w, b) + linear(linear(x, down), up)) * gate + residual, with every epilogue, odd sizes, a
// blocked gate, transposed pair views, ranks 1 and 16.
TEST(FusedLinear, LowRankPairMatchesTheChain) {
  struct Case {
    Shape x_shape;
    int64_t n, rank;
    bool bias, gate, residual;
    Activation act;
    bool transposed;
  };
  const Case cases[] = {
      {{41, 23}, 13, 4, true, false, false, Activation::None, false},
      {{2, 37, 45}, 33, 16, true, true, true, Activation::GeluTanh, false},
      {{3, 5, 19}, 17, 1, false, true, false, Activation::Silu, true},
      {{1, 21, 64}, 48, 8, true, false, true, Activation::Gelu, true},
  };
  for (DType dtype : {float32, bfloat16}) {
    uint32_t seed = 40;
    for (const Case& c : cases) {
      const int64_t k = c.x_shape.back();
      Shape out_shape = c.x_shape;
      out_shape.back() = c.n;
      const Tensor x = values(c.x_shape, seed, -1, 1, dtype);
      const Tensor w = values({c.n, k}, seed + 1, -0.3, 0.3, dtype);
      const Tensor bias = c.bias ? values({c.n}, seed + 2, -0.5, 0.5, dtype) : Tensor();
      Shape gate_shape = out_shape;
      gate_shape[gate_shape.size() - 2] = 1;
      LinearEpilogue e{c.act, c.gate ? values(gate_shape, seed + 3, -2, 2, dtype) : Tensor(),
                       c.residual ? values(out_shape, seed + 4, -1, 1, dtype) : Tensor()};
      e.low_rank_down = c.transposed ? values({k, c.rank}, seed + 5, -0.5, 0.5, dtype).transpose(0, 1)
                                     : values({c.rank, k}, seed + 5, -0.5, 0.5, dtype);
      e.low_rank_up = c.transposed ? values({c.rank, c.n}, seed + 6, -0.5, 0.5, dtype).transpose(0, 1)
                                   : values({c.n, c.rank}, seed + 6, -0.5, 0.5, dtype);
      seed += 10;
      const Tensor fused = linear_fused(x, w, bias, e);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " x " + shape_str(c.x_shape) + " rank " +
                   std::to_string(c.rank));
      ASSERT_EQ(fused.shape(), out_shape);
      const Tensor pre = add(linear(x, w, bias), linear(linear(x, e.low_rank_down), e.low_rank_up));
      Tensor chain = activate(pre, c.act);
      if (c.gate) chain = mul(e.gate, chain);
      if (c.residual) chain = add(e.residual, chain);
      EXPECT_TRUE(close(fused, chain, dtype == float32 ? 1e-5 : 0x1p-6));
    }
  }
}

TEST(FusedLinear, RejectsBadArgumentsNamingTheOp) {
  const Tensor x = values({2, 3, 8}, 1);
  const Tensor w = values({5, 8}, 2);
  const auto expect_error = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find("linear_fused"), std::string::npos) << msg;
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };
  expect_error(error_of([&] { linear_fused(x, values({5, 7}, 3), {}, {}); }), "features");
  expect_error(error_of([&] { linear_fused(x, values({5}, 3), {}, {}); }), "weight");
  expect_error(error_of([&] { linear_fused(x, w.to(bfloat16), {}, {}); }), "bfloat16");
  expect_error(error_of([&] { linear_fused(x.to(int64), w.to(int64), {}, {}); }), "int64");
  expect_error(error_of([&] { linear_fused(x, w, values({4}, 3), {}); }), "bias");
  expect_error(error_of([&] {
                 linear_fused(x, w, {}, {Activation::None, values({3, 1, 5}, 3), {}});
               }),
               "gate");
  expect_error(error_of([&] {
                 linear_fused(x, w, {}, {Activation::None, values({2, 3, 6}, 3), {}});
               }),
               "gate");
  expect_error(error_of([&] {
                 linear_fused(x, w, {}, {Activation::None, values({2, 1, 5}, 3, -1, 1, bfloat16), {}});
               }),
               "gate");
  expect_error(error_of([&] {
                 linear_fused(x, w, {}, {Activation::None, {}, values({2, 1, 5}, 3)});
               }),
               "residual");
  expect_error(error_of([&] {
                 linear_fused(x, w, {}, {Activation::None, {}, values({2, 3, 5}, 3, -1, 1, bfloat16)});
               }),
               "residual");
  expect_error(error_of([&] { linear_fused(x, w, {}, {static_cast<Activation>(9), {}, {}}); }), "activation");
  // The low-rank pair: both, shapes that chain, x's dtype, not float16.
  const Tensor down = values({2, 8}, 4), up = values({5, 2}, 5);
  expect_error(error_of([&] { linear_fused(x, w, {}, {.low_rank_down = down}); }), "both down and up");
  expect_error(error_of([&] {
                 linear_fused(x, w, {}, {.low_rank_down = values({2, 7}, 4), .low_rank_up = up});
               }),
               "down [R, 8] and up [5, R]");
  expect_error(error_of([&] {
                 linear_fused(x, w, {}, {.low_rank_down = down, .low_rank_up = values({5, 3}, 5)});
               }),
               "down [R, 8] and up [5, R]");
  expect_error(
      error_of([&] { linear_fused(x, w, {}, {.low_rank_down = down.to(bfloat16), .low_rank_up = up}); }),
      "same dtype");
  expect_error(error_of([&] {
                 linear_fused(x.to(float16), w.to(float16), {},
                              {.low_rank_down = down.to(float16), .low_rank_up = up.to(float16)});
               }),
               "float16");
}

// ---- norm_modulate

Tensor norm(const Tensor& x, NormKind kind, double eps) {
  return kind == NormKind::LayerNorm ? layer_norm(x, 1, {}, {}, eps) : rms_norm(x, {}, eps);
}

// The chain norm_modulate replaces, op by op in the inputs' dtypes.
Tensor modulate_unfused(const Tensor& x, const Tensor& scale, const Tensor& shift, NormKind kind,
                        double eps) {
  return add(mul(norm(x, kind, eps), add(1.0, scale)), shift);
}

Tensor modulate_float_then_round(const Tensor& x, const Tensor& scale, const Tensor& shift, NormKind kind,
                                 double eps) {
  return modulate_unfused(x.to(float32), scale.to(float32), shift.to(float32), kind, eps).to(x.dtype());
}

struct ModulateCase {
  Shape x_shape, scale_shape, shift_shape;
};

const std::vector<ModulateCase> kModulateCases = {
    {{2, 37, 45}, {2, 1, 45}, {2, 1, 45}},  // adaLN, odd C with a partial vector
    {{3, 5, 64}, {3, 1, 64}, {1, 64}},      // mixed broadcasts
    {{1, 7, 17}, {17}, {1, 1, 17}},
    {{19, 33}, {1, 33}, {33}},
    {{2, 4, 3, 20}, {2, 1, 1, 20}, {2, 4, 1, 20}},  // 4-D: blocks differ between scale and shift
    {{2, 6, 9}, {2, 6, 9}, {2, 6, 1}},              // full-size and per-row operands
    {{1, 3, 1}, {1, 1, 1}, {1}},                    // C = 1
    {{2, 3, 5000}, {2, 1, 5000}, {2, 1, 5000}},     // rows longer than one float32 summation block
};

void run_modulate_case(const ModulateCase& c, DType dtype, DType param_dtype, NormKind kind, uint32_t seed) {
  const double eps = 1e-6;
  // An offset mean and a wide range: the centred variance must keep its precision.
  const Tensor x = values(c.x_shape, seed, -2, 3, dtype);
  const Tensor scale = values(c.scale_shape, seed + 1, -0.5, 0.5, param_dtype);
  const Tensor shift = values(c.shift_shape, seed + 2, -1, 1, param_dtype);
  const Tensor fused = norm_modulate(x, scale, shift, kind, eps);
  SCOPED_TRACE(std::string(dtype_name(dtype)) + (kind == NormKind::LayerNorm ? " layer" : " rms") + " x " +
               shape_str(c.x_shape) + " scale " + shape_str(c.scale_shape));
  ASSERT_EQ(fused.dtype(), dtype);
  if (dtype == float32) {
    EXPECT_TRUE(close(fused, modulate_unfused(x, scale, shift, kind, eps), 1e-5));
  } else if (dtype == bfloat16) {
    EXPECT_TRUE(close(fused, modulate_unfused(x, scale, shift, kind, eps).to(dtype), 0x1p-6));
    EXPECT_TRUE(close(fused, modulate_float_then_round(x, scale, shift, kind, eps), 0x1p-8));
  } else {
    EXPECT_TRUE(close(fused, modulate_float_then_round(x, scale, shift, kind, eps), 0x1p-10));
  }
}

TEST(FusedNormModulate, MatchesUnfusedChain) {
  uint32_t seed = 1;
  for (NormKind kind : {NormKind::LayerNorm, NormKind::RmsNorm})
    for (const ModulateCase& c : kModulateCases) {
      run_modulate_case(c, float32, float32, kind, seed++);
      run_modulate_case(c, bfloat16, bfloat16, kind, seed++);
      run_modulate_case(c, float16, float16, kind, seed++);
      run_modulate_case(c, bfloat16, float32, kind, seed++);  // float32 modulation of a bf16 stream
    }
}

TEST(FusedNormModulate, NonContiguousInput) {
  const Tensor x = values({40, 2, 24}, 3, -1, 2).transpose(0, 1);  // [2, 40, 24]
  const Tensor scale = values({2, 1, 24}, 4, -0.5, 0.5);
  const Tensor shift = values({2, 1, 24}, 5);
  for (NormKind kind : {NormKind::LayerNorm, NormKind::RmsNorm})
    EXPECT_TRUE(close(norm_modulate(x, scale, shift, kind, 1e-5),
                      modulate_unfused(x, scale, shift, kind, 1e-5), 1e-5));
}

TEST(FusedNormModulate, ScaleAndShiftAsStridedSlicesOfTheModulationEmbedding) {
  const Tensor emb = values({2, 6 * 40}, 6, -0.5, 0.5);
  const Tensor shift = emb.narrow(1, 0, 40).unsqueeze(1);  // [2, 1, 40]
  const Tensor scale = emb.narrow(1, 40, 40).unsqueeze(1);
  const Tensor x = values({2, 21, 40}, 7, -1, 2);
  for (NormKind kind : {NormKind::LayerNorm, NormKind::RmsNorm})
    EXPECT_TRUE(close(norm_modulate(x, scale, shift, kind, 1e-6),
                      modulate_unfused(x, scale, shift, kind, 1e-6), 1e-5));
}

// Both ISA variants of the row kernel, called directly, against the float32 chain.
TEST(FusedNormModulate, BothIsaVariants) {
  const int64_t batch = 2, seq = 23, c = 77;  // 4 full vectors and a 13-lane tail per row
  for (DType dtype : {float32, bfloat16, float16}) {
    for (bool layer : {true, false}) {
      const Tensor x = values({batch, seq, c}, 11, -2, 3, dtype);
      const Tensor scale = values({batch, 1, c}, 12, -0.5, 0.5);
      const Tensor shift = values({batch, 1, c}, 13);
      const NormKind kind = layer ? NormKind::LayerNorm : NormKind::RmsNorm;
      const Tensor expected = modulate_float_then_round(x, scale, shift, kind, 1e-6);
      synchronize();  // the row kernel is called directly, outside the stream that wrote x
      const auto run = [&](auto fn) {
        Tensor y = Tensor::empty(x.shape(), dtype);
        fn(layer, dtype, x.raw_data(), static_cast<const float*>(scale.raw_data()),
           static_cast<const float*>(shift.raw_data()), y.raw_data(), batch * seq, c, seq, 1e-6f);
        return y;
      };
      const double tol = dtype == float32 ? 1e-5 : dtype == bfloat16 ? 0x1p-8 : 0x1p-10;
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (layer ? " layer" : " rms"));
      EXPECT_TRUE(close(run(cpu_kernels::generic::norm_modulate_rows), expected, tol)) << "generic";
      if (cpu_kernels::cpu_features().avx512) {
        EXPECT_TRUE(close(run(cpu_kernels::avx512::norm_modulate_rows), expected, tol)) << "avx512";
      }
    }
  }
}

TEST(FusedNormModulate, RejectsBadArgumentsNamingTheOp) {
  const Tensor x = values({2, 3, 8}, 1);
  const Tensor p = values({2, 1, 8}, 2);
  const auto expect_error = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find("norm_modulate"), std::string::npos) << msg;
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };
  expect_error(error_of([&] {
                 norm_modulate(x, values({2, 1, 7}, 2), p, NormKind::LayerNorm, 1e-6);
               }),
               "scale");
  expect_error(error_of([&] {
                 norm_modulate(x, p, values({3, 1, 8}, 2), NormKind::LayerNorm, 1e-6);
               }),
               "shift");
  expect_error(error_of([&] {
                 norm_modulate(x, values({2, 2, 3, 8}, 2), p, NormKind::RmsNorm, 1e-6);
               }),
               "scale");
  expect_error(error_of([&] { norm_modulate(x.to(int32), p, p, NormKind::LayerNorm, 1e-6); }), "int32");
  expect_error(error_of([&] { norm_modulate(x, p.to(int64), p, NormKind::LayerNorm, 1e-6); }), "int64");
  expect_error(error_of([&] { norm_modulate(x, p, Tensor(), NormKind::LayerNorm, 1e-6); }), "shift");
  expect_error(error_of([&] { norm_modulate(x, p, p, NormKind::LayerNorm, -1.0); }), "eps");
  expect_error(error_of([&] { norm_modulate(x, p, p, static_cast<NormKind>(5), 1e-6); }), "kind");
}

}  // namespace
}  // namespace kiln
