// Deferred-and-fused and compiled mode on a PJRT device (xla-cpu, the CPU plugin scripts/setup.sh --pjrt
// installs): a region of calls becomes ONE executable, launched once, storing only what is still referenced,
// with strict eager's values; a compiled forward is one executable per input shape, and repeated blocks
// share one. The module text itself is checked in tests/pjrt/region_module_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/pjrt/executable_cache.h"
#include "kiln/core/allocator.h"
#include "kiln/core/tensor.h"
#include "kiln/nn/module.h"
#include "kiln/ops.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/device_ledger.h"
#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/execution_context.h"
#include "support/pjrt_devices.h"

namespace kiln {
namespace {

const Device xla0 = testing::test_device(0);

Tensor ramp(const Shape& shape, float scale, DType dtype = float32) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i) * scale + 0.3f) * 1.5f;
  return Tensor::from_vector(v, shape).to(dtype);
}

// Executables run through the cache (every PJRT launch asks it once), whatever served them.
int64_t executable_requests() {
  const pjrt::ExecutableCacheStats s = pjrt::executable_cache_stats();
  return s.compiles + s.hits + s.disk_hits;
}

// Elementwise, linear, softmax and a norm: the ops a transformer block chains.
struct Chain {
  Tensor x, w, b, gamma, beta;
  Chain on(Device d) const { return {x.to(d), w.to(d), b.to(d), gamma.to(d), beta.to(d)}; }
  Tensor run() const {
    const Tensor h = gelu(add(mul(x, 0.75), 0.25), GeluApproximate::Tanh);
    const Tensor y = linear(h, w, b);
    const Tensor s = softmax(y, -1);
    return layer_norm(add(s, y), 1, gamma, beta, 1e-5);
  }
};

Chain make_chain(DType dtype) {
  return {ramp({2, 3, 16}, 0.37f, dtype), mul(ramp({24, 16}, 0.11f), 0.3).to(dtype), ramp({24}, 0.7f, dtype),
          ramp({24}, 0.23f, dtype), ramp({24}, 0.51f, dtype)};
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel, double abs,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - want[i]), abs + rel * std::fabs(want[i]))
        << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
}

TEST(PjrtModes, AFusedChainIsOneExecutableWithStrictEagersValues) {
  KILN_SKIP_WITHOUT_PJRT();
  const Chain chain = make_chain(float32).on(xla0);
  const std::vector<float> eager = chain.run().to_vector<float>();

  synchronize(xla0);  // the inputs' copies to the device are done before counting
  reset_counters();
  const int64_t requests = executable_requests();
  const int64_t allocations = memory_stats(xla0).allocations;
  Tensor fused;
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    fused = chain.run();
  }
  const std::vector<float> values = fused.to_vector<float>();
  EXPECT_EQ(executable_requests() - requests, 1) << "the chain must run as one executable";
  const Counters c = counters();
  EXPECT_EQ(c.fused_kernels_launched, 1);
  EXPECT_EQ(c.ops_fused, 7) << "every call of the chain joins the region";
  // Only the result is stored: no intermediate's storage is ever given a device buffer.
  EXPECT_EQ(memory_stats(xla0).allocations - allocations, 1);
  expect_close(values, eager, 1e-6, 1e-7, "fused vs strict eager on xla-cpu");

  // A second flush of the same structure reuses the executable: no compile.
  const pjrt::ExecutableCacheStats before = pjrt::executable_cache_stats();
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    fused = chain.run();
  }
  (void)fused.to_vector<float>();
  EXPECT_EQ(pjrt::executable_cache_stats().compiles, before.compiles);
  EXPECT_EQ(pjrt::executable_cache_stats().hits, before.hits + 1);
}

TEST(PjrtModes, AFusedBf16ChainMatchesTheCpuBackend) {
  KILN_SKIP_WITHOUT_PJRT();
  const Chain chain = make_chain(bfloat16);
  const std::vector<float> on_cpu = chain.run().to_vector<float>();
  Tensor fused;
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    fused = chain.on(xla0).run();
  }
  EXPECT_EQ(fused.dtype(), bfloat16);
  // Each op rounds to bfloat16 once on both backends; a result may differ by a rounding or two (8 bits).
  expect_close(fused.to_vector<float>(), on_cpu, 2.0 / 128, 1.0 / 128, "fused bf16 on xla-cpu vs the CPU");
}

TEST(PjrtModes, ValuesReadAfterTheRegionAreStoredAndIntermediatesAreNot) {
  KILN_SKIP_WITHOUT_PJRT();
  const Tensor x = ramp({4, 8}, 0.2f).to(xla0);
  synchronize(xla0);  // the inputs' copies to the device are done before counting
  reset_counters();
  const int64_t allocations = memory_stats(xla0).allocations;
  Tensor kept, last;
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    const Tensor dropped = exp(mul(x, 0.5));
    kept = add(dropped, 1.0);
    last = tanh(mul(kept, kept));
  }
  const std::vector<float> kept_values = kept.to_vector<float>();
  const std::vector<float> last_values = last.to_vector<float>();
  EXPECT_EQ(memory_stats(xla0).allocations - allocations, 2) << "kept and last only";
  EXPECT_EQ(counters().fused_kernels_launched, 1);
  const std::vector<float> xs = x.to_vector<float>();
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_NEAR(kept_values[i], std::exp(xs[i] * 0.5f) + 1.0f, 1e-5) << i;
    EXPECT_NEAR(last_values[i], std::tanh(kept_values[i] * kept_values[i]), 1e-5) << i;
  }
}

// A region's intermediates live in the executable's scratch (XLA's temporary buffers), not in arrays of
// Kiln's: the scratch is counted on the device while the region runs (the peak shows it, the limit of
// --max-memory refuses a run it does not fit) and released when it ends.
TEST(PjrtModes, ARegionsScratchIsCountedWhileItRuns) {
  KILN_SKIP_WITHOUT_PJRT();
  const Tensor a = ramp({64, 64}, 0.13f).to(xla0), b = mul(ramp({64, 64}, 0.29f), 0.1).to(xla0);
  const auto chained = [&] {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    return matmul(matmul(a, b), b);  // the first product is held between the two, in the scratch
  };
  const int64_t result_bytes = 64 * 64 * 4;
  synchronize(xla0);
  const int64_t held = memory_stats(xla0).current_bytes;
  reset_peak_memory(xla0);
  Tensor y = chained();
  synchronize(xla0);
  EXPECT_GE(memory_stats(xla0).peak_bytes - held, result_bytes + result_bytes)
      << "the result and the first product's scratch";
  EXPECT_EQ(memory_stats(xla0).current_bytes - held, result_bytes) << "the scratch is released after the run";
  const std::vector<float> values = y.to_vector<float>();
  y = Tensor();

  // Room for the result but not for the scratch beside it: refused naming the scratch, nothing left held.
  set_memory_limit(xla0, current_device_ledger(xla0)->held() + result_bytes + 4096);
  const std::string message = testing::error_message([&] {
    const Tensor z = chained();
    synchronize(xla0);
  });
  set_memory_limit(xla0, std::nullopt);
  EXPECT_NE(message.find(xla0.str() + " is out of memory: the scratch of region["), std::string::npos)
      << message;
  synchronize(xla0);
  EXPECT_EQ(memory_stats(xla0).current_bytes, held);
  EXPECT_EQ(chained().to_vector<float>(), values) << "the device runs again once the limit is lifted";
}

TEST(PjrtModes, AStepSizeChangingEveryFlushCompilesOnce) {
  KILN_SKIP_WITHOUT_PJRT();
  // A scheduler step as the pipelines write it: sample + dt * velocity, dt different at every step. The
  // scalar is a parameter of the region, not a constant in its text.
  const Tensor sample = ramp({2, 8}, 0.3f).to(xla0), velocity = ramp({2, 8}, 0.7f).to(xla0);
  const std::vector<float> s = sample.to_vector<float>(), v = velocity.to_vector<float>();
  const pjrt::ExecutableCacheStats before = pjrt::executable_cache_stats();
  for (double dt : {-0.25, -0.125, -0.0625}) {
    Tensor next;
    {
      EagerModeGuard defer(EagerMode::DeferAndFuse);
      next = exp(add(sample, mul(velocity, dt)));
    }
    const std::vector<float> got = next.to_vector<float>();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], std::exp(s[i] + static_cast<float>(dt) * v[i]), 1e-5)
          << "dt " << dt << ", element " << i;
  }
  const pjrt::ExecutableCacheStats after = pjrt::executable_cache_stats();
  EXPECT_LE(after.compiles + after.disk_hits - before.compiles - before.disk_hits, 1);
  EXPECT_EQ(after.hits - before.hits, 2) << "the second and third steps reuse the first one's executable";
}

// A block: norm, linear, gelu and a residual, its weights registered as parameters.
class TinyBlock : public nn::Module {
 public:
  TinyBlock(Device device, float seed) {
    register_parameter("weight", &weight_, {16, 16});
    register_parameter("bias", &bias_, {16});
    register_parameter("norm", &norm_, {16});
    weight_ = mul(ramp({16, 16}, 0.13f * seed), 0.25).to(device);
    bias_ = ramp({16}, 0.31f * seed).to(device);
    norm_ = ramp({16}, 0.17f * seed).to(device);
  }
  Tensor forward(const Tensor& x) const {
    return call_compiled({x}, [this](const std::vector<Tensor>& in) {
      const Tensor h = rms_norm(in[0], norm_, 1e-6);
      return std::vector<Tensor>{add(in[0], gelu(linear(h, weight_, bias_), GeluApproximate::Tanh))};
    })[0];
  }
  bool supports_compile() const override { return true; }

 private:
  Tensor weight_, bias_, norm_;
};

class TinyStack : public nn::Module {
 public:
  TinyStack(Device device, int n) {
    for (int i = 0; i < n; ++i) {
      blocks_.push_back(std::make_unique<TinyBlock>(device, 1.0f + 0.5f * static_cast<float>(i)));
      register_module("blocks." + std::to_string(i), blocks_.back().get());
    }
  }
  Tensor forward(Tensor x) const {
    for (const auto& block : blocks_) x = block->forward(x);
    return x;
  }
  std::vector<nn::BlockList> repeated_blocks() const override { return {nn::block_list("blocks", blocks_)}; }

 private:
  std::vector<std::unique_ptr<TinyBlock>> blocks_;
};

TEST(PjrtModes, ACompiledForwardIsOneExecutablePerShape) {
  KILN_SKIP_WITHOUT_PJRT();
  TinyBlock block(xla0, 1.0f);
  const Tensor x = ramp({2, 5, 16}, 0.29f).to(xla0);
  const std::vector<float> eager = block.forward(x).to_vector<float>();
  block.compile();
  synchronize(xla0);  // the inputs' copies to the device are done before counting
  reset_counters();
  const int64_t requests = executable_requests();
  const int64_t allocations = memory_stats(xla0).allocations;
  const std::vector<float> compiled = block.forward(x).to_vector<float>();
  EXPECT_EQ(counters().graphs_compiled, 1);
  EXPECT_EQ(executable_requests() - requests, 1) << "the whole forward is one executable";
  EXPECT_EQ(memory_stats(xla0).allocations - allocations, 1) << "only the output is stored";
  expect_close(compiled, eager, 1e-6, 1e-7, "compiled vs strict eager on xla-cpu");

  // The same shape again: nothing is traced or compiled; a new shape: one more of each.
  const Tensor doubled = mul(x, 2.0);
  synchronize(xla0);
  const pjrt::ExecutableCacheStats before = pjrt::executable_cache_stats();
  (void)block.forward(doubled).to_vector<float>();
  EXPECT_EQ(pjrt::executable_cache_stats().compiles + pjrt::executable_cache_stats().disk_hits,
            before.compiles + before.disk_hits);
  const Tensor x2 = ramp({1, 7, 16}, 0.41f).to(xla0);
  synchronize(xla0);
  const pjrt::ExecutableCacheStats before_new = pjrt::executable_cache_stats();
  (void)block.forward(x2).to_vector<float>();
  const pjrt::ExecutableCacheStats after_new = pjrt::executable_cache_stats();
  EXPECT_EQ(after_new.compiles + after_new.disk_hits - before_new.compiles - before_new.disk_hits, 1);
  EXPECT_EQ(block.compiled_program_count(), 2u);
}

TEST(PjrtModes, RepeatedBlocksShareOneExecutable) {
  KILN_SKIP_WITHOUT_PJRT();
  constexpr int kBlocks = 4;
  TinyStack stack(xla0, kBlocks);
  const Tensor x = ramp({3, 16}, 0.19f).to(xla0);
  const std::vector<float> eager = stack.forward(x).to_vector<float>();
  stack.compile_repeated_blocks();
  synchronize(xla0);  // the inputs' copies to the device are done before counting
  reset_counters();
  const pjrt::ExecutableCacheStats before = pjrt::executable_cache_stats();
  const std::vector<float> compiled = stack.forward(x).to_vector<float>();
  const pjrt::ExecutableCacheStats after = pjrt::executable_cache_stats();
  EXPECT_EQ(counters().graphs_compiled, 1) << "one program for the block class";
  // One executable (compiled now, or loaded from an earlier process's disk cache), then reused by the others.
  EXPECT_EQ(after.compiles + after.disk_hits - before.compiles - before.disk_hits, 1);
  EXPECT_EQ(after.hits - before.hits, kBlocks - 1);
  // Four blocks, each adding to the residual stream (outputs up to ~17): an element that cancels down to
  // ~0.06 keeps the absolute roundoff of its larger terms. XLA compiles the block's fused elementwise tail
  // for the host's ISA, and on an Intel Xeon with AMX (where one such element differs by 5.9e-7) it rounds
  // differently from the eager ops' executables; the bound is a few float32 ulps of the stream's scale.
  expect_close(compiled, eager, 1e-6, 2e-6, "compiled blocks vs strict eager on xla-cpu");
}

}  // namespace
}  // namespace kiln
