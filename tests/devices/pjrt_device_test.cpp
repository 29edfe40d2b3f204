// Tensors and ops on a PJRT device through Kiln's public API — Tensor::to, the ops, memory counters, errors —
// against Kiln's own CPU backend. The device is xla-cpu: XLA's CPU compiler behind the PJRT plugin that
// scripts/setup.sh --pjrt (and --tests) installs, which creates several devices, so placement on a second
// device is tested too. The per-op StableHLO itself is checked op by op in tests/pjrt/.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "backends/pjrt/executable_cache.h"
#include "kiln/core/allocator.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/ops.h"
#include "kiln/runtime/devices.h"
#include "kiln/runtime/execution_context.h"
#include "runtime/dispatcher.h"
#include "support/pjrt_devices.h"

namespace kiln {
namespace {

const Device xla0 = testing::test_device(0);
const Device xla1 = testing::test_device(1);

std::vector<float> ramp(int64_t n, float scale = 0.37f, float shift = -1.5f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i) * scale) * 2.0f + shift * 0.1f;
  return v;
}

void expect_near(const Tensor& device_result, const Tensor& cpu_result, double tol) {
  ASSERT_EQ(device_result.shape(), cpu_result.shape());
  const std::vector<float> a = device_result.to_vector<float>();
  const std::vector<float> b = cpu_result.to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], tol * (1.0 + std::fabs(b[i]))) << "element " << i;
}

TEST(PjrtDevice, EveryDtypeRoundTrips) {
  KILN_SKIP_WITHOUT_PJRT();
  const Tensor f = Tensor::from_vector(ramp(12), {3, 4});
  for (DType dtype : {float32, bfloat16, float16, int64, int32, uint8, boolean}) {
    const Tensor host = f.to(dtype);
    const Tensor on_device = host.to(xla0);
    EXPECT_EQ(on_device.device(), xla0);
    EXPECT_EQ(on_device.dtype(), dtype);
    const Tensor back = on_device.to(cpu);
    EXPECT_EQ(back.device(), cpu);
    EXPECT_EQ(back.to_vector<float>(), host.to_vector<float>()) << dtype_name(dtype);
  }
}

TEST(PjrtDevice, ViewsAndConversionsMoveBothWays) {
  KILN_SKIP_WITHOUT_PJRT();
  const Tensor x = Tensor::from_vector(ramp(60), {3, 4, 5});
  // A permuted, sliced and broadcast host view goes to the device as its values.
  const Tensor host_view = x.permute({2, 0, 1}).slice(0, 1, 5, 2);
  EXPECT_EQ(host_view.to(xla0).to_vector<float>(), host_view.contiguous().to_vector<float>());
  const Tensor wide = Tensor::from_vector(ramp(4), {4, 1}).expand({4, 6});
  EXPECT_EQ(wide.to(xla0).to_vector<float>(), wide.contiguous().to_vector<float>());
  // Views of a device tensor read back as the same views.
  const Tensor d = x.to(xla0);
  EXPECT_EQ(d.transpose(0, 2).to(cpu).to_vector<float>(), x.transpose(0, 2).contiguous().to_vector<float>());
  EXPECT_EQ(d.select(1, 2).to(cpu).to_vector<float>(), x.select(1, 2).contiguous().to_vector<float>());
  // A dtype conversion across the move rounds as on the host.
  Tensor as_bf16 = Tensor::empty({3, 4, 5}, bfloat16, xla0);
  as_bf16.copy_(x);
  EXPECT_EQ(as_bf16.to_vector<float>(), x.to(bfloat16).to_vector<float>());
  Tensor host_bf16 = Tensor::empty({3, 4, 5}, bfloat16);
  host_bf16.copy_(d);
  EXPECT_EQ(host_bf16.to_vector<float>(), x.to(bfloat16).to_vector<float>());
}

TEST(PjrtDevice, WritesIntoPartOfATensorKeepTheRest) {
  KILN_SKIP_WITHOUT_PJRT();
  Tensor d = Tensor::full({4, 6}, 7.0, float32, xla0);
  d.narrow(1, 2, 3).copy_(Tensor::from_vector(ramp(12), {4, 3}));
  Tensor expected = Tensor::full({4, 6}, 7.0);
  expected.narrow(1, 2, 3).copy_(Tensor::from_vector(ramp(12), {4, 3}));
  EXPECT_EQ(d.to_vector<float>(), expected.to_vector<float>());
  // A strided host destination of a device source.
  Tensor host = Tensor::zeros({6, 4});
  host.transpose(0, 1).copy_(d);
  Tensor host_expected = Tensor::zeros({6, 4});
  host_expected.transpose(0, 1).copy_(expected);
  EXPECT_EQ(host.to_vector<float>(), host_expected.to_vector<float>());
}

TEST(PjrtDevice, ATransformerLayerMatchesTheCpuBackend) {
  KILN_SKIP_WITHOUT_PJRT();
  for (DType dtype : {float32, bfloat16}) {
    const Tensor x = Tensor::from_vector(ramp(2 * 6 * 16), {2, 6, 16}).to(dtype);
    const Tensor w1 = mul(Tensor::from_vector(ramp(32 * 16, 0.11f), {32, 16}), 0.25).to(dtype);
    const Tensor b1 = Tensor::from_vector(ramp(32, 0.7f), {32}).to(dtype);
    const Tensor w2 = mul(Tensor::from_vector(ramp(16 * 32, 0.05f), {16, 32}), 0.2).to(dtype);
    const Tensor gamma = Tensor::from_vector(ramp(16, 0.3f), {16}).to(dtype);
    auto layer = [](const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                    const Tensor& gamma) {
      const Tensor h = rms_norm(x, gamma, 1e-6);
      const Tensor q = h.view({2, 6, 2, 8}).transpose(1, 2);
      const Tensor a = scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape({2, 6, 16});
      const Tensor m = linear(gelu(linear(add(x, a), w1, b1), GeluApproximate::Tanh), w2);
      return sum(softmax(add(m, x), -1), {1});
    };
    const Tensor on_cpu = layer(x, w1, b1, w2, gamma);
    const Tensor on_device = layer(x.to(xla0), w1.to(xla0), b1.to(xla0), w2.to(xla0), gamma.to(xla0));
    EXPECT_EQ(on_device.device(), xla0);
    EXPECT_EQ(on_device.dtype(), dtype);
    expect_near(on_device, on_cpu, dtype == float32 ? 1e-5 : 2e-2);
  }
}

TEST(PjrtDevice, OpsRunOnTheDeviceOfTheirOperands) {
  KILN_SKIP_WITHOUT_PJRT();
  const Tensor a = Tensor::from_vector(ramp(8), {8});
  const Tensor on1 = mul(a.to(xla1), 3.0);
  EXPECT_EQ(on1.device(), xla1);
  EXPECT_EQ(on1.to_vector<float>(), mul(a, 3.0).to_vector<float>());
  // Between two devices of the plugin.
  const Tensor on0 = on1.to(xla0);
  EXPECT_EQ(on0.device(), xla0);
  EXPECT_EQ(on0.to_vector<float>(), on1.to_vector<float>());
  EXPECT_DOUBLE_EQ(sum(on0, {0}).item(), sum(mul(a, 3.0), {0}).item());
}

TEST(PjrtDevice, EachDistinctCallCompilesOnce) {
  KILN_SKIP_WITHOUT_PJRT();
  const Tensor a = Tensor::from_vector(ramp(10, 0.9f), {2, 5}).to(xla0);
  (void)tanh(a).to_vector<float>();  // whatever this process compiled before
  const auto before = pjrt::executable_cache_stats();
  for (int i = 0; i < 3; ++i) (void)tanh(a).to_vector<float>();
  const auto after = pjrt::executable_cache_stats();
  EXPECT_EQ(after.compiles, before.compiles);
  EXPECT_GE(after.hits - before.hits, 3);
  // A new shape compiles, or loads what an earlier process compiled from the disk cache.
  (void)tanh(Tensor::from_vector(ramp(9), {9}).to(xla0)).to_vector<float>();
  const auto added = pjrt::executable_cache_stats();
  EXPECT_EQ(added.compiles + added.disk_hits, after.compiles + after.disk_hits + 1);
}

TEST(PjrtDevice, AScalarArgumentIsNotPartOfTheExecutable) {
  KILN_SKIP_WITHOUT_PJRT();
  // A scheduler's step, dt different every time: one executable for every dt.
  const Tensor a = Tensor::from_vector(ramp(6, 0.4f), {2, 3});
  const Tensor d = a.to(xla0);
  synchronize(xla0);
  const auto before = pjrt::executable_cache_stats();
  for (double dt : {0.5, -0.0625, 3.0})
    EXPECT_EQ(mul(d, dt).to_vector<float>(), mul(a, dt).to_vector<float>());
  const auto after = pjrt::executable_cache_stats();
  EXPECT_LE(after.compiles + after.disk_hits - before.compiles - before.disk_hits, 1);
  EXPECT_EQ(after.hits - before.hits, 2);
}

TEST(PjrtDevice, MemoryIsCountedPerDevice) {
  KILN_SKIP_WITHOUT_PJRT();
  const int64_t before = memory_stats(xla1).current_bytes;
  {
    const Tensor t = Tensor::zeros({256, 4}, float32, xla1);
    synchronize(xla1);
    EXPECT_EQ(memory_stats(xla1).current_bytes - before, 256 * 4 * 4);
  }
  synchronize(xla1);
  EXPECT_EQ(memory_stats(xla1).current_bytes, before);
}

TEST(PjrtDevice, MixedDevicesAreRefusedNamingBoth) {
  KILN_SKIP_WITHOUT_PJRT();
  const Tensor a = Tensor::from_vector(ramp(4), {4});
  const std::string e = testing::error_message([&] { (void)add(a, a.to(xla0)); });
  EXPECT_NE(e.find("add: operands on cpu and " + xla0.str() + "; move them to one device first (Tensor::to)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("Tensor::to"), std::string::npos) << e;
}

TEST(PjrtDevice, AnOpWithoutALoweringIsRefusedByName) {
  KILN_SKIP_WITHOUT_PJRT();
  const Tensor x = Tensor::zeros({2, 4}, float32, xla0);
  runtime::OpCall call{"linear_quantized", {x}, {Tensor::empty({2, 4}, float32, xla0)}, {}};
  const std::string e = testing::error_message([&] { runtime::dispatch(std::move(call)); });
  EXPECT_NE(e.find("linear_quantized is not supported on " + xla0.str() +
                   " (the pjrt backend has no kernel for it)"),
            std::string::npos)
      << e;
}

TEST(PjrtDevice, ReadingATensorNothingWroteIsAnError) {
  KILN_SKIP_WITHOUT_PJRT();
  const Tensor never_written = Tensor::empty({3}, float32, xla0);
  const std::string e = testing::error_message([&] { (void)add(never_written, 1.0).to_vector<float>(); });
  EXPECT_NE(e.find("which no op has written"), std::string::npos) << e;
  // The stream reported it once and goes on.
  EXPECT_EQ(add(Tensor::zeros({3}, float32, xla0), 1.0).to_vector<float>(), std::vector<float>({1, 1, 1}));
}

TEST(PjrtDevice, ADeviceBeyondThePluginsIsNamed) {
  KILN_SKIP_WITHOUT_PJRT();
  const std::string e =
      testing::error_message([] { (void)Tensor::zeros({2}, float32, testing::test_device(64)); });
  const std::string kind = testing::test_device_kind();
  EXPECT_NE(e.find("device " + kind + ":64 does not exist: the " + kind + " plugin"), std::string::npos) << e;
}

TEST(PjrtDevice, DevicesAreListedWithTheirPlugin) {
  KILN_SKIP_WITHOUT_PJRT();
  bool listed = false;
  for (const DeviceTypeStatus& s : available_devices()) {
    if (s.type == DeviceType::CPU) {
      EXPECT_EQ(s.devices.size(), 1u);
    }
    if (s.type != DeviceType::XlaCpu) continue;
    listed = true;
    ASSERT_GE(s.devices.size(), 2u) << s.unavailable_because;
    EXPECT_EQ(s.devices[1].device, xla1);
    EXPECT_EQ(s.devices[1].backend, "pjrt");
    EXPECT_NE(s.devices[1].description.find("PJRT API 0."), std::string::npos) << s.devices[1].description;
  }
  EXPECT_TRUE(listed);
}

}  // namespace
}  // namespace kiln
