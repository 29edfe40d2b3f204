// DeferAndFuse: recorded ops give the same values as strict eager, while the counters show what the lazy
// graph did — fused chains, dropped dead code and duplicates, intermediates never allocated, repeating blocks
// flushed on their own, and no recompilation for new scalar values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kiln/core/device_runtime.h"
#include "kiln/ops.h"
#include "kiln/ops/fused.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/execution_context.h"
#include "runtime/deferred.h"
#include "support/test_data.h"

namespace kiln {
namespace {

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int64_t>(s >> 40) % 2001 - 1000) / 250.0f;
  }
  return Tensor::from_vector(v, shape).to(dtype);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  synchronize();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

// adaLN modulation followed by an activation, as a DiT block does it.
Tensor modulate_gelu(const Tensor& x, const Tensor& scale, const Tensor& shift) {
  return gelu(add(mul(x, add(1.0, scale)), shift), GeluApproximate::Tanh);
}

class DeferAndFuse : public ::testing::TestWithParam<DType> {};

TEST_P(DeferAndFuse, ChainFusesIntoOneKernelWithTheEagerValues) {
  const DType dt = GetParam();
  const Tensor x = random_tensor({2, 37, 48}, dt, 1);
  const Tensor scale = random_tensor({2, 1, 48}, dt, 2), shift = random_tensor({2, 1, 48}, dt, 3);
  const Tensor expected = modulate_gelu(x, scale, shift);
  synchronize();
  reset_counters();
  Tensor fused;
  {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    fused = modulate_gelu(x, scale, shift);
    EXPECT_EQ(runtime::deferred_op_count(), 4u);
    EXPECT_EQ(counters().kernels_launched, 0);
  }
  synchronize();
  const Counters c = counters();
  EXPECT_EQ(c.ops_dispatched, 4);
  EXPECT_EQ(c.ops_fused, 4);
  EXPECT_EQ(c.kernels_launched, 1);
  EXPECT_EQ(c.fused_kernels_launched, 1);
  EXPECT_TRUE(bitwise_equal(fused, expected));
}

TEST_P(DeferAndFuse, IntermediatesAreNeverAllocated) {
  const DType dt = GetParam();
  const Tensor x = random_tensor({64, 1024}, dt, 4);
  const Tensor scale = random_tensor({1, 1024}, dt, 5), shift = random_tensor({1, 1024}, dt, 6);
  synchronize();
  const int64_t out_bytes = static_cast<int64_t>(x.nbytes());
  reset_counters();
  {
    const Tensor eager = modulate_gelu(x, scale, shift);
    synchronize();
  }
  const int64_t eager_peak = counters().memory_of(cpu).peak_bytes - memory_stats(cpu).current_bytes;
  reset_counters();
  {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    const Tensor fused = modulate_gelu(x, scale, shift);
    synchronize();
    // Only the result was allocated: mul's and add's [64, 1024] intermediates never were.
    EXPECT_EQ(counters().memory_of(cpu).peak_bytes - memory_stats(cpu).current_bytes + out_bytes, out_bytes);
  }
  EXPECT_GE(eager_peak, 2 * out_bytes);
}

TEST_P(DeferAndFuse, UnreadResultsAreNeverComputed) {
  const DType dt = GetParam();
  const Tensor x = random_tensor({16, 16}, dt, 7);
  synchronize();
  reset_counters();
  {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    { const Tensor unused = exp(mul(x, 2.0)); }
    synchronize();
  }
  const Counters c = counters();
  EXPECT_EQ(c.ops_dispatched, 2);
  EXPECT_EQ(c.ops_eliminated, 2);
  EXPECT_EQ(c.kernels_launched, 0);
}

TEST_P(DeferAndFuse, CommonSubexpressionsRunOnce) {
  const DType dt = GetParam();
  const Tensor t = random_tensor({4, 96}, dt, 8);
  const Tensor w = random_tensor({32, 96}, dt, 9);
  // Two blocks each compute silu(temb) before their own projection, as diffusers' AdaLayerNorm does.
  const Tensor expected = add(linear(silu(t), w), linear(silu(t), w));
  synchronize();
  reset_counters();
  Tensor got;
  {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    got = add(linear(silu(t), w), linear(silu(t), w));
    synchronize();
  }
  EXPECT_EQ(counters().ops_eliminated, 2);  // the second silu and the second linear
  EXPECT_EQ(counters().kernels_launched, 3);
  EXPECT_TRUE(bitwise_equal(got, expected));
}

// Largest |a - b| relative to max |b|.
double rel_max_error(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to(float32).to_vector<float>(), y = b.to(float32).to_vector<float>();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(x[i] - y[i])));
    den = std::max(den, static_cast<double>(std::fabs(y[i])));
  }
  return num / std::max(den, 1e-30);
}

TEST_P(DeferAndFuse, DiTChainsBecomeFusedOps) {
  const DType dt = GetParam();
  const double tol = dt == float32 ? 1e-5 : 2e-2;
  const Tensor h = random_tensor({2, 24, 64}, dt, 20);
  const Tensor w1 = mul(random_tensor({128, 64}, dt, 21), 0.1), b1 = random_tensor({128}, dt, 22);
  const Tensor w2 = mul(random_tensor({64, 128}, dt, 23), 0.1), b2 = random_tensor({64}, dt, 24);
  const Tensor scale = random_tensor({2, 1, 64}, dt, 25), shift = random_tensor({2, 1, 64}, dt, 26);
  const Tensor gate = random_tensor({2, 1, 64}, dt, 27);
  // A DiT MLP branch: adaLN-modulated norm, linear + gelu(tanh), linear, gated residual.
  auto mlp = [&] {
    const Tensor n = add(mul(layer_norm(h, 1, Tensor(), Tensor(), 1e-6), add(1.0, scale)), shift);
    const Tensor a = gelu(linear(n, w1, b1), GeluApproximate::Tanh);
    return add(h, mul(gate, linear(a, w2, b2)));
  };
  const Tensor expected = mlp();
  synchronize();
  reset_counters();
  Tensor got;
  {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    got = mlp();
    synchronize();
  }
  const Counters c = counters();
  EXPECT_EQ(c.chains_fused, 3);  // norm_modulate, linear_fused(gelu_tanh), linear_fused(gate, residual)
  // Eager launches 9 kernels; fused: the 3 fused ops, the dead 1 + scale dropped, plus (bfloat16) the
  // float32 modulation tables norm_modulate prepares.
  EXPECT_LE(c.kernels_launched, 5);
  EXPECT_LT(rel_max_error(got, expected), tol);
}

// The same branch with a LoRA adapter on both linears (nn::Linear's linear_fused carrying the low-rank pair):
// the activation, gate and residual still fuse into the products, which keep their pairs.
TEST_P(DeferAndFuse, LowRankPairsKeepTheirChainsFused) {
  const DType dt = GetParam();
  const double tol = dt == float32 ? 1e-5 : 2e-2;
  const Tensor h = random_tensor({2, 24, 64}, dt, 30);
  const Tensor w1 = mul(random_tensor({128, 64}, dt, 31), 0.1), b1 = random_tensor({128}, dt, 32);
  const Tensor w2 = mul(random_tensor({64, 128}, dt, 33), 0.1);
  const Tensor a1 = mul(random_tensor({4, 64}, dt, 34), 0.05),
               u1 = mul(random_tensor({128, 4}, dt, 35), 0.05);
  const Tensor a2 = mul(random_tensor({4, 128}, dt, 36), 0.05),
               u2 = mul(random_tensor({64, 4}, dt, 37), 0.05);
  const Tensor gate = random_tensor({2, 1, 64}, dt, 38);
  auto mlp = [&] {
    const Tensor a =
        gelu(linear_fused(h, w1, b1, {.low_rank_down = a1, .low_rank_up = u1}), GeluApproximate::Tanh);
    return add(h, mul(gate, linear_fused(a, w2, Tensor(), {.low_rank_down = a2, .low_rank_up = u2})));
  };
  // The unfused chain, op by op.
  const Tensor n1 = add(linear(h, w1, b1), linear(linear(h, a1), u1));
  const Tensor n2 = linear(gelu(n1, GeluApproximate::Tanh), w2);
  const Tensor expected = add(h, mul(gate, add(n2, linear(linear(gelu(n1, GeluApproximate::Tanh), a2), u2))));
  synchronize();
  reset_counters();
  Tensor got;
  {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    got = mlp();
    synchronize();
  }
  const Counters c = counters();
  EXPECT_EQ(c.chains_fused, 2);  // linear_fused(pair, gelu_tanh), linear_fused(pair, gate, residual)
  EXPECT_EQ(c.kernels_launched, 2);
  EXPECT_LT(rel_max_error(got, expected), tol);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DeferAndFuse, ::testing::Values(float32, bfloat16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// A block of ops between two non-fusable ops (so that the block has fused and unfused parts), repeated.
Tensor block(const Tensor& h, const Tensor& w, const Tensor& scale, const Tensor& shift) {
  Tensor y = linear(h, w);
  y = add(h, mul(modulate_gelu(y, scale, shift), 0.5));
  return layer_norm(y, 1, Tensor(), Tensor(), 1e-6);
}

TEST(DeferAndFuseBlocks, RepeatingBlocksFlushOnTheirOwnAndReuseKernels) {
  const Tensor w = random_tensor({48, 48}, float32, 10);
  const Tensor scale = random_tensor({1, 48}, float32, 11), shift = random_tensor({1, 48}, float32, 12);
  const Tensor h0 = random_tensor({8, 48}, float32, 13);
  Tensor expected = h0;
  for (int i = 0; i < 6; ++i) expected = block(expected, w, scale, shift);
  synchronize();
  reset_counters();
  Tensor h = h0;
  {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    for (int i = 0; i < 6; ++i) h = block(h, w, scale, shift);
    // The blocks were flushed as they repeated, not kept until the read below.
    EXPECT_GE(counters().graph_flushes, 3);
    EXPECT_LT(runtime::deferred_op_count(), 3 * 8u);
    synchronize();
  }
  const Counters c = counters();
  EXPECT_TRUE(bitwise_equal(h, expected));
  EXPECT_GT(c.ops_fused, 0);
  // Every block has the same structure, so its fused kernel is built (or loaded) once and then reused.
  EXPECT_LE(c.kernels_compiled + c.kernel_cache_disk_hits, 2);
  EXPECT_GE(c.kernel_cache_memory_hits, 3);
}

TEST(DeferAndFuseScalars, NewScalarValuesReuseTheKernel) {
  const Tensor x = random_tensor({3, 40}, bfloat16, 14), v = random_tensor({3, 40}, bfloat16, 15);
  auto step = [&](double sigma, double sigma_next) { return add(x, mul(v, sigma_next - sigma)).to(float32); };
  {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    step(1.0, 0.75).data<float>();
  }
  reset_counters();
  Tensor got;
  {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    got = step(0.75, 0.3125);
    synchronize();
  }
  EXPECT_EQ(counters().kernels_compiled, 0);
  EXPECT_EQ(counters().kernel_cache_disk_hits, 0);
  EXPECT_EQ(counters().fused_kernels_launched, 1);
  EXPECT_TRUE(bitwise_equal(got, step(0.75, 0.3125)));
}

TEST(DeferAndFuseReads, HostReadFlushesAndSeesTheValues) {
  const Tensor x = random_tensor({5, 7}, float32, 16);
  const std::vector<float> expected = sigmoid(mul(x, 3.0)).to_vector<float>();
  EagerModeGuard mode(EagerMode::DeferAndFuse);
  const Tensor y = sigmoid(mul(x, 3.0));
  EXPECT_EQ(runtime::deferred_op_count(), 2u);
  EXPECT_EQ(y.to_vector<float>(), expected);
  EXPECT_EQ(runtime::deferred_op_count(), 0u);
}

TEST(DeferAndFuseErrors, KernelErrorsSurfaceAtTheSynchronisationNamingTheOp) {
  const Tensor table = random_tensor({4, 3}, float32, 17);
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{0, 9}, {2});
  EagerModeGuard mode(EagerMode::DeferAndFuse);
  Tensor rows;
  ASSERT_NO_THROW(rows = embedding(table, ids));
  try {
    synchronize();
    FAIL() << "expected the out-of-range id to be reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embedding"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
