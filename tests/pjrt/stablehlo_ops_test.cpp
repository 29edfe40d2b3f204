// Every lowered op against Kiln's CPU kernels, in float32 and bfloat16: the op's front end runs under a
// CaptureGuard to get the exact OpCall, the CPU kernel gives the expected output storage, and op_module(call)
// runs on the PJRT CPU plugin. Whole output storages are compared, so the elements outside an output view
// (a narrow() written by copy_) must come through unchanged. Skips without a PJRT build or plugin.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/pjrt/stablehlo/op_lowering.h"
#include "kiln/ops/attention.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/layout.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduction.h"
#include "models/flux_embeddings.h"
#include "pjrt/stablehlo_test_support.h"
#include "support/scoped_env.h"
#include "support/test_data.h"

namespace kiln::pjrt::hlo {
namespace {

using kiln::testing::values;
using testing::Tolerance;

// One bf16 ulp of the result (2^-8 relative at worst, 2^-7 for values just above a power of two).
constexpr Tolerance kBf16Elementwise{1.0 / 128, 1e-6};
constexpr Tolerance kExact{0, 0};
constexpr Tolerance kF32Elementwise{1e-6, 1e-7};
constexpr Tolerance kF32Reduction{1e-5, 1e-6};
// Products and reductions over bf16 inputs: both sides accumulate in float32 and round once, but in another
// order, so a result near a rounding boundary may land one ulp apart.
constexpr Tolerance kBf16Reduction{1.0 / 64, 1e-3};

class PjrtOps : public ::testing::TestWithParam<DType> {
 protected:
  DType dt() const { return GetParam(); }
  bool bf16() const { return GetParam() == bfloat16; }
  Tolerance elementwise() const { return bf16() ? kBf16Elementwise : kF32Elementwise; }
  Tolerance reduction() const { return bf16() ? kBf16Reduction : kF32Reduction; }
  Tensor rand(const Shape& s, uint32_t seed, double lo = -2, double hi = 2) const {
    return values(s, seed, lo, hi, dt());
  }
};

INSTANTIATE_TEST_SUITE_P(Dtypes, PjrtOps, ::testing::Values(float32, bfloat16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST_P(PjrtOps, BinaryWithBroadcasting) {
  const Tensor a = rand({2, 3, 4}, 1), b = rand({3, 1}, 2, 0.5, 2);
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { add(a, b); });
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { sub(a, b); });
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { mul(a, b); });
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { div(a, b); });
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { maximum(a, b); });
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { minimum(a, b); });
  EXPECT_PJRT_MATCHES_CPU((Tolerance{bf16() ? 1.0 / 128 : 2e-6, 1e-6}), [&] { pow(abs(a), b); });
}

TEST_P(PjrtOps, ScalarOperandsOnEitherSide) {
  const Tensor a = rand({5, 7}, 3);
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { add(a, 0.3); });
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { sub(1.5, a); });
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { mul(a, 1.0 / 3); });
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { div(2.0, a); });
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { pow(a, 2.0); });
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { pow(abs(a), 1.7); });
}

TEST_P(PjrtOps, ComparisonsAndWhere) {
  const Tensor a = rand({4, 6}, 4), b = rand({6}, 5);
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { eq(a, a); });
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { ne(a, b); });
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { lt(a, b); });
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { le(a, 0.25); });
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { gt(a, b); });
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { ge(a, b); });
  const Tensor cond = gt(a, 0.0);
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { where(cond, a, b); });
}

TEST_P(PjrtOps, UnaryOps) {
  const Tensor x = rand({3, 33}, 6, -4, 4), pos = rand({3, 33}, 7, 0.1, 4);
  const Tolerance tol = bf16() ? kBf16Elementwise : Tolerance{4e-6, 1e-6};  // transcendental: a few f32 ulps
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { neg(x); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { abs(x); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { square(x); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { exp(x); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { log(pos); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { sqrt(pos); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { rsqrt(pos); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { sin(x); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { cos(x); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { tanh(x); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { sigmoid(x); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { silu(x); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { gelu(x); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { gelu(x, GeluApproximate::Tanh); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { quick_gelu(x); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { clamp(x, -1.0, 0.5); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { clamp(x, std::nullopt, 0.5); });
}

TEST_P(PjrtOps, CopyConvertsDtypes) {
  const Tensor x = rand({4, 5}, 8, -100, 100);
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { x.to(bf16() ? float32 : bfloat16); });
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { x.to(float16); });
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { x.to(int64); });
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { gt(x, 0.0).to(dt()); });
}

TEST_P(PjrtOps, StridedPermutedAndBroadcastInputViews) {
  const Tensor x = rand({4, 6, 8}, 9);
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { x.permute({2, 0, 1}).contiguous(); });            // transpose
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { x.narrow(2, 3, 4).contiguous(); });               // inner narrow
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { x.slice(1, 1, 6, 2).contiguous(); });             // step slice
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { x.select(0, 3).transpose(0, 1).contiguous(); });  // offset
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { x.narrow(1, 5, 1).expand({4, 3, 8}).contiguous(); });
  // Overlapping strides (no box): the gather fallback.
  const Tensor flat = rand({20}, 10);
  const Tensor windows(flat.storage(), {5, 4}, {3, 1}, 1, dt());
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { add(windows, 1.0); });
}

TEST_P(PjrtOps, OutputIntoASliceOfALargerTensor) {
  Tensor big = rand({4, 10}, 11);
  const Tensor src = rand({4, 3}, 12);
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { big.narrow(1, 5, 3).copy_(src); });                // strided box
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { big.narrow(0, 1, 2).copy_(rand({2, 10}, 60)); });  // offset, dense
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { big.narrow(1, 0, 8).transpose(0, 1).copy_(rand({8, 4}, 13)); });
  const Tensor flat = rand({30}, 14);
  Tensor diagonal(flat.storage(), {5}, {6}, 2, dt());  // step 6: a strided box with a tail past the end
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { diagonal.copy_(rand({5}, 15)); });
}

TEST_P(PjrtOps, Reductions) {
  const Tensor x = rand({3, 17, 5}, 16);
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { sum(x, {1}); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { sum(x, {0, 2}, true); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { mean(x, {2}); });
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { max(x, {1}); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { var(x, {1}); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { var(x, {}, 0); });
}

TEST_P(PjrtOps, SoftmaxAndNorms) {
  const Tensor x = rand({2, 5, 24}, 17, -3, 3);
  const Tensor w = values({24}, 18, 0.5, 1.5), b = values({24}, 19);
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { softmax(x, -1); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { softmax(x, 1); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { layer_norm(x, 1, w, b, 1e-5); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { layer_norm(x, 1, Tensor(), Tensor(), 1e-6); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { rms_norm(x, w.to(dt()), 1e-6); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { rms_norm(x, Tensor(), 1e-6); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { rms_norm(x, w.to(dt()), 1e-6, RmsNormStyle::Llama); });
  const Tensor img = rand({2, 8, 3, 5}, 20);
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { group_norm(img, 4, values({8}, 21), values({8}, 22), 1e-5); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { group_norm(img, 2, Tensor(), Tensor(), 1e-5); });
  const Tensor scale = rand({2, 1, 24}, 23, -0.5, 0.5), shift = rand({2, 1, 24}, 24);
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { norm_modulate(x, scale, shift, NormKind::LayerNorm, 1e-6); });
  EXPECT_PJRT_MATCHES_CPU(reduction(), [&] { norm_modulate(x, scale, shift, NormKind::RmsNorm, 1e-6); });
}

TEST_P(PjrtOps, LayoutOps) {
  const Tensor a = rand({2, 3, 4}, 25), b = rand({2, 5, 4}, 26);
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { concat({a, b, a}, 1); });
  const Tensor table = rand({10, 6}, 27);
  const Tensor ids = Tensor::from_vector<int64_t>({3, 0, 9, 3, 7, 1}, {2, 3});
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { embedding(table, ids); });
  const Tensor img = rand({1, 2, 3, 5}, 28);
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { upsample_nearest2d(img, 2); });
  EXPECT_PJRT_MATCHES_CPU(kExact, [&] { upsample_nearest2d(img, 7, 8); });
  const Tensor x = rand({1, 2, 6, 8}, 29), c = values({6, 8}, 30), s = values({6, 8}, 31);
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { apply_rope(x, c, s, RopeStyle::Interleaved); });
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { apply_rope(x, c, s, RopeStyle::RotateHalf); });
  // A head-split view: the output is sequence-major (a transposed view covering its whole storage).
  const Tensor heads = rand({1, 6, 2, 8}, 32).transpose(1, 2);
  EXPECT_PJRT_MATCHES_CPU(elementwise(), [&] { apply_rope(heads, c, s, RopeStyle::Interleaved); });
}

TEST(PjrtOpsF32, FluxRopeTables) {
  const Tensor ids = values({7, 3}, 33, 0, 64).to(int64).to(float32);
  EXPECT_PJRT_MATCHES_CPU((Tolerance{1e-6, 1e-6}), [&] {
    models::flux_rope_tables(ids, {4, 6, 6}, 10000.0);
  });
}

TEST_P(PjrtOps, Products) {
  const Tensor a = rand({2, 5, 16}, 34), b = rand({1, 16, 7}, 35);
  const Tolerance tol = bf16() ? kBf16Reduction : kF32Reduction;
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { matmul(a, b); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { matmul(a, a.transpose(1, 2)); });
  const Tensor x = rand({3, 4, 16}, 36), w = rand({12, 16}, 37), bias = rand({12}, 38);
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { linear(x, w); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { linear(x, w, bias); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { linear(x, w, values({12}, 39)); });  // float32 bias
  const Tensor img = rand({2, 4, 7, 6}, 40), k = rand({6, 2, 3, 3}, 41), kb = rand({6}, 42);
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { conv2d(img, k, kb, {1, 1}, {1, 1}, {1, 1}, 2); });
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { conv2d(img, rand({3, 4, 3, 2}, 43), {}, {2, 1}, {0, 1}, {1, 2}, 1); });
}

TEST_P(PjrtOps, Attention) {
  const Tensor q = rand({1, 2, 5, 8}, 44), k = rand({1, 2, 7, 8}, 45), v = rand({1, 2, 7, 4}, 46);
  const Tolerance tol = bf16() ? kBf16Reduction : kF32Reduction;
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { scaled_dot_product_attention(q, k, v, {}); });
  AttentionOptions causal;
  causal.is_causal = true;
  causal.scale = 0.5;
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { scaled_dot_product_attention(q, k, v, causal); });
  AttentionOptions biased;
  biased.bias = values({2, 5, 7}, 47);
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { scaled_dot_product_attention(q, k, v, biased); });
  AttentionOptions masked;
  masked.bias = gt(values({1, 7}, 48), -0.5);
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { scaled_dot_product_attention(q, k, v, masked); });
}

// A TPU's attention: a loop over blocks of keys with a running softmax (lower_fused.cpp), forced here on
// the CPU plugin with small blocks: keys that fill whole blocks and keys padded to them, causal, more queries
// than keys and fewer, one head dim for v and another for k. A bias keeps the composition.
TEST_P(PjrtOps, AttentionOverKeyBlocks) {
  kiln::testing::ScopedEnv env;
  env.set("KILN_PJRT_ATTENTION_KEY_BLOCK", "4");
  // bf16: the CPU kernel rounds the probabilities to bf16 before the product with v (as torch's bf16
  // attention does), this lowering keeps them in f32 (as the composition does): at most one bf16 rounding of
  // each term, 2^-8 x sum_j p_j |v_j| <= 2^-7 for |v| <= 2, whatever the output's own size.
  const Tolerance tol = bf16() ? Tolerance{1.0 / 64, 1.0 / 64} : kF32Reduction;
  for (const int64_t keys : {8, 11, 3}) {
    for (const int64_t queries : {5, 13}) {
      const Tensor q = rand({2, 3, queries, 8}, 50), k = rand({2, 3, keys, 8}, 51),
                   v = rand({2, 3, keys, 16}, 52);
      EXPECT_PJRT_MATCHES_CPU(tol, [&] { scaled_dot_product_attention(q, k, v, {}); });
      AttentionOptions causal;
      causal.is_causal = true;
      causal.scale = 0.3;
      EXPECT_PJRT_MATCHES_CPU(tol, [&] { scaled_dot_product_attention(q, k, v, causal); });
    }
  }
  const Tensor q = rand({1, 2, 5, 8}, 53), k = rand({1, 2, 9, 8}, 54), v = rand({1, 2, 9, 8}, 55);
  const auto calls = testing::capture_calls([&] { scaled_dot_product_attention(q, k, v, {}); });
  const std::string looped = op_module(calls.back(), lowering_target("cpu")).text;
  EXPECT_NE(looped.find("\"stablehlo.while\""), std::string::npos) << looped;
  EXPECT_EQ(looped.find("tensor<1x2x5x9xf32>"), std::string::npos) << "the whole scores are held:\n"
                                                                   << looped;
  AttentionOptions biased;
  biased.bias = values({2, 5, 9}, 56);
  const auto biased_calls = testing::capture_calls([&] { scaled_dot_product_attention(q, k, v, biased); });
  EXPECT_EQ(op_module(biased_calls.back(), lowering_target("cpu")).text.find("stablehlo.while"),
            std::string::npos);
  env.set("KILN_PJRT_ATTENTION_KEY_BLOCK", "0");
  EXPECT_EQ(op_module(calls.back(), lowering_target("cpu")).text.find("stablehlo.while"), std::string::npos);
  env.set("KILN_PJRT_ATTENTION_KEY_BLOCK", "many");
  EXPECT_THROW(lowering_target("cpu"), Error);
  env.set("KILN_PJRT_ATTENTION_KEY_BLOCK", std::nullopt);
  EXPECT_EQ(lowering_target("tpu").attention_key_block, 256);
  EXPECT_EQ(lowering_target("cuda").attention_key_block, 0);
  EXPECT_EQ(lowering_target("cpu").attention_key_block, 0);
}

TEST_P(PjrtOps, LinearFusedEpilogues) {
  const Tensor x = rand({2, 6, 16}, 49), w = rand({12, 16}, 50), bias = rand({12}, 51);
  const Tolerance tol = bf16() ? kBf16Reduction : kF32Reduction;
  for (Activation act : {Activation::None, Activation::Gelu, Activation::GeluTanh, Activation::Silu}) {
    LinearEpilogue e;
    e.act = act;
    EXPECT_PJRT_MATCHES_CPU(tol, [&] { linear_fused(x, w, bias, e); });
  }
  LinearEpilogue gated;
  gated.gate = rand({2, 1, 12}, 52);
  gated.residual = rand({2, 6, 12}, 53);
  gated.act = Activation::Silu;
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { linear_fused(x, w, bias, gated); });
  LinearEpilogue full_gate;
  full_gate.gate = rand({12}, 54);
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { linear_fused(x, w, Tensor(), full_gate); });
  LinearEpilogue lora;
  lora.low_rank_down = rand({3, 16}, 55);
  lora.low_rank_up = rand({12, 3}, 56);
  lora.act = Activation::Gelu;
  EXPECT_PJRT_MATCHES_CPU(tol, [&] { linear_fused(x, w, bias, lora); });
}

TEST(PjrtLowering, UnloweredOpsAreNamedInTheError) {
  EXPECT_FALSE(has_lowering("linear_quantized"));
  EXPECT_FALSE(has_lowering("all_reduce_sum"));
  EXPECT_TRUE(has_lowering("scaled_dot_product_attention"));
  runtime::OpCall call{"all_gather", {Tensor::zeros({2}, float32)}, {Tensor::zeros({4}, float32)}, {}};
  try {
    op_module(call);
    FAIL() << "op_module accepted all_gather";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'all_gather' has no StableHLO lowering"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln::pjrt::hlo
