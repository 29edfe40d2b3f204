// The CPU stream in the default (asynchronous) eager mode: enqueue returns before the kernel runs, work
// runs in order, host reads wait, failures surface at the next synchronisation naming the op, and process
// exit with work queued is clean.
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/eager_mode.h"
#include "support/test_data.h"
#include "test_kernels.h"

namespace kiln {
namespace {

using runtime_test::run;

std::string sync_error() {
  try {
    synchronize();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

class CpuStream : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime_test::register_test_kernels();
    synchronize();  // start from an idle stream
    runtime_test::appended.clear();
  }
  EagerModeGuard mode_{EagerMode::DeferNever};
};

TEST_F(CpuStream, EnqueueReturnsBeforeTheKernelFinishes) {
  runtime_test::block_release = false;
  runtime_test::block_finished = false;
  run("runtime_test.block", {}, {Tensor::empty({2, 3})});
  // A synchronous dispatch would only return once the kernel gave up waiting (20 s) and set the flag.
  EXPECT_FALSE(runtime_test::block_finished.load());
  runtime_test::block_release = true;
  synchronize();
  EXPECT_TRUE(runtime_test::block_finished.load());
}

TEST_F(CpuStream, RunsTasksInSubmissionOrder) {
  for (int64_t i = 0; i < 200; ++i) run("runtime_test.append", {}, {Tensor::empty({1})}, i);
  synchronize();
  ASSERT_EQ(runtime_test::appended.size(), 200u);
  for (int64_t i = 0; i < 200; ++i) EXPECT_EQ(runtime_test::appended[static_cast<size_t>(i)], i);
}

TEST_F(CpuStream, OpsOnTheSameTensorSeeEachOthersResults) {
  Tensor x = Tensor::zeros({37});
  for (int i = 0; i < 50; ++i) x = add(x, 1.0);
  Tensor y = Tensor::empty({37});
  y.copy_(Tensor::full({37}, 1.0));
  y.copy_(mul(x, 2.0));  // the later write wins
  const auto v = y.to_vector<float>();
  for (float f : v) EXPECT_EQ(f, 100.0f);
}

TEST_F(CpuStream, HostReadsWaitForQueuedWrites) {
  Tensor t = Tensor::zeros({5});
  run("runtime_test.sleep_write", {}, {t}, 7, 50);
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(5, 7.0f));

  Tensor s = Tensor::zeros({1});
  run("runtime_test.sleep_write", {}, {s}, 9, 50);
  EXPECT_EQ(s.item(), 9.0);

  Tensor d = Tensor::zeros({3});
  run("runtime_test.sleep_write", {}, {d}, 5, 50);
  EXPECT_EQ(d.data<float>()[2], 5.0f);

  Tensor w = Tensor::zeros({4});
  run("runtime_test.sleep_write", {}, {w}, 3, 50);
  const std::string path = testing::temp_dir("runtime_stream") + "/w.safetensors";
  io::save_safetensors(path, {{"w", w}});
  EXPECT_EQ(io::SafetensorsFile(path).tensor("w").to_vector<float>(), std::vector<float>(4, 3.0f));
}

TEST_F(CpuStream, AFailureSurfacesAtTheNextSynchronizeNamingTheOp) {
  const int64_t launched_before = counters().kernels_launched;
  run("runtime_test.fail", {Tensor::zeros({2, 3})}, {Tensor::empty({4}, bfloat16)});  // returns: queued
  run("runtime_test.append", {}, {Tensor::empty({1})}, 1);                            // skipped
  const std::string message = sync_error();
  EXPECT_NE(message.find("runtime_test.fail(float32[2, 3]) -> bfloat16[4]"), std::string::npos) << message;
  EXPECT_NE(message.find("deliberate failure"), std::string::npos) << message;
  EXPECT_TRUE(runtime_test::appended.empty());
  EXPECT_EQ(counters().kernels_launched - launched_before, 1);
  // Reported once; the stream runs later work again.
  EXPECT_EQ(sync_error(), "");
  run("runtime_test.append", {}, {Tensor::empty({1})}, 2);
  synchronize();
  EXPECT_EQ(runtime_test::appended, std::vector<int64_t>{2});
}

TEST_F(CpuStream, AFailureSurfacesAtAHostRead) {
  Tensor out = Tensor::zeros({1});
  run("runtime_test.fail_std", {Tensor::zeros({3})}, {out});
  try {
    (void)out.item();
    FAIL() << "item() did not report the failed op";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("runtime_test.fail_std(float32[3]) -> float32[1] failed: plain failure"),
              std::string::npos)
        << m;
  }
  EXPECT_EQ(out.item(), 0.0);
}

TEST_F(CpuStream, LaunchBlockingSurfacesAFailureAtTheCall) {
  EagerModeGuard blocking(EagerMode::DeferNeverLaunchBlocking);
  try {
    run("runtime_test.fail", {Tensor::zeros({2})}, {Tensor::empty({2})});
    FAIL() << "the failing op did not throw at the call";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runtime_test.fail(float32[2]) -> float32[2]: deliberate failure"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(sync_error(), "");  // already reported

  Tensor t = Tensor::zeros({2});
  run("runtime_test.sleep_write", {}, {t}, 4, 30);
  // The call returned after the kernel: its write is visible without any synchronisation.
  EXPECT_EQ(static_cast<float*>(t.raw_data())[1], 4.0f);
}

TEST_F(CpuStream, KernelsMayDispatchAndReadFromTheWorker) {
  Tensor t = Tensor::zeros({3});
  run("runtime_test.nested", {}, {t});
  synchronize();
  EXPECT_EQ(runtime_test::nested_read.load(), 42.0);
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(3, 42.0f));
}

TEST_F(CpuStream, KernelsOnTheWorkerUseAllOpenMPThreads) {
  run("runtime_test.omp", {}, {Tensor::empty({1})});
  synchronize();
  EXPECT_EQ(runtime_test::omp_team.load(), omp_get_max_threads());
}

TEST_F(CpuStream, ManyHostThreadsCanDispatchAtOnce) {
  std::vector<std::vector<float>> results(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([k, &results] {
      Tensor x = Tensor::full({19}, k);
      for (int i = 0; i < 40; ++i) x = add(x, 1.0);
      results[static_cast<size_t>(k)] = x.to_vector<float>();
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(results[static_cast<size_t>(k)], std::vector<float>(19, 40.0f + k));
}

TEST_F(CpuStream, ReleasesTensorsOnceTheirOpsRan) {
  synchronize();
  const int64_t before = memory_stats().current_bytes;
  {
    Tensor big = Tensor::zeros({1 << 20});
    Tensor out = mul(big, 3.0);
    (void)out;
  }  // the host dropped both; the queued op still holds them
  synchronize();
  EXPECT_EQ(memory_stats().current_bytes, before);
}

// Exit paths run in a fresh process (the "threadsafe" style re-executes this binary).
class CpuStreamExit : public CpuStream {
 protected:
  CpuStreamExit() { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CpuStreamExit, ExitWithWorkQueuedIsClean) {
  EXPECT_EXIT(
      {
        Tensor w = Tensor::full({256, 256}, 0.01, bfloat16);
        Tensor x = Tensor::full({64, 256}, 1.0, bfloat16);
        for (int i = 0; i < 20; ++i) x = linear(x, w);
        run("runtime_test.sleep_write", {}, {Tensor::empty({1})}, 1, 100);
        for (int i = 0; i < 20; ++i) x = add(x, 1.0);
        std::exit(3);
      },
      ::testing::ExitedWithCode(3), "");
}

TEST_F(CpuStreamExit, ExitWithAnUnreportedFailureIsClean) {
  EXPECT_EXIT(
      {
        run("runtime_test.fail", {}, {Tensor::empty({1})});
        std::exit(4);
      },
      ::testing::ExitedWithCode(4), "");
}

}  // namespace
}  // namespace kiln
