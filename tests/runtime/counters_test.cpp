// Runtime counters: ops dispatched, kernels launched, and per-device memory, with reset and snapshot.
#include <gtest/gtest.h>

#include <string>

#include "kiln/kiln.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/eager_mode.h"
#include "test_kernels.h"

namespace kiln {
namespace {

TEST(Counters, CountOpsAtDispatchAndKernelsWhenTheyRun) {
  EagerModeGuard mode(EagerMode::DeferNever);
  synchronize();
  reset_counters();
  runtime_test::block_release = false;
  runtime_test::block_finished = false;
  runtime_test::run("runtime_test.block", {}, {Tensor::empty({1})});
  Tensor x = Tensor::zeros({8});
  x = add(x, 1.0);
  x = mul(x, 2.0);
  const Counters queued = counters();
  EXPECT_EQ(queued.ops_dispatched, 3);
  EXPECT_LE(queued.kernels_launched, 1);  // the others wait behind the blocked kernel
  runtime_test::block_release = true;
  synchronize();
  const Counters done = counters();
  EXPECT_EQ(done.ops_dispatched, 3);
  EXPECT_EQ(done.kernels_launched, 3);

  reset_counters();
  EXPECT_EQ(counters().ops_dispatched, 0);
  EXPECT_EQ(counters().kernels_launched, 0);
}

TEST(Counters, SkippedOpsAreNotLaunched) {
  EagerModeGuard mode(EagerMode::DeferNever);
  synchronize();
  reset_counters();
  runtime_test::run("runtime_test.fail", {}, {Tensor::empty({1})});
  (void)add(Tensor::zeros({4}), 1.0);
  EXPECT_THROW(synchronize(), Error);
  EXPECT_EQ(counters().ops_dispatched, 2);
  EXPECT_EQ(counters().kernels_launched, 1);
}

TEST(Counters, FrontEndErrorsDispatchNothing) {
  synchronize();
  reset_counters();
  EXPECT_THROW((void)add(Tensor::zeros({3}), Tensor::zeros({4})), Error);
  EXPECT_EQ(counters().ops_dispatched, 0);
}

TEST(Counters, MemoryPerDevice) {
  synchronize();
  reset_counters();
  const DeviceMemoryCounters start = counters().memory_of(cpu);
  EXPECT_EQ(start.peak_bytes, start.current_bytes);
  EXPECT_EQ(start.allocations, 0);
  {
    Tensor big = Tensor::empty({1 << 20});  // 4 MiB
    (void)big.raw_data();                   // storage is allocated at its first touch
    const DeviceMemoryCounters held = counters().memory_of(cpu);
    EXPECT_EQ(held.current_bytes - start.current_bytes, 4 << 20);
    EXPECT_GE(held.peak_bytes, held.current_bytes);
    EXPECT_EQ(held.allocations, 1);
  }
  const DeviceMemoryCounters after = counters().memory_of(cpu);
  EXPECT_EQ(after.current_bytes, start.current_bytes);
  EXPECT_GE(after.peak_bytes, start.current_bytes + (4 << 20));
  reset_counters();
  const DeviceMemoryCounters reset = counters().memory_of(cpu);
  EXPECT_EQ(reset.peak_bytes, reset.current_bytes);
  EXPECT_EQ(reset.allocations, 0);
}

TEST(Counters, MemoryOfADeviceWithoutARuntimeThrows) {
  try {
    (void)counters().memory_of(Device(DeviceType::CUDA, 0));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("counters: no memory counters for device cuda"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
