// The CPU stream in the default (asynchronous) eager mode: enqueue returns before the kernel runs, work
// runs in order, host reads wait, failures surface at the next synchronisation naming the op, OpenMP
// teams on the host and the worker coexist, and process exit and fork with work queued are clean.
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

TEST_F(CpuStream, HostAndWorkerOpenMPTeamsRunTogether) {
  // Kernels run OpenMP teams on the worker while the host thread may run its own (a JIT kernel, inline
  // work): two teams of omp_get_max_threads() on the same cores must both finish, with correct results.
  Tensor x = Tensor::zeros({1 << 16});
  for (int i = 0; i < 30; ++i) {
    x = add(x, 1.0);
    run("runtime_test.omp", {}, {Tensor::empty({1})});
  }
  std::vector<double> partial(static_cast<size_t>(omp_get_max_threads()), 0.0);
  for (int round = 0; round < 30; ++round) {
#pragma omp parallel
    {
      double acc = 0;
      for (int i = 0; i < 20000; ++i) acc += 1e-3;
      partial[static_cast<size_t>(omp_get_thread_num())] += acc;
    }
  }
  synchronize();
  EXPECT_EQ(runtime_test::omp_team.load(), omp_get_max_threads());
  double total = 0;
  for (double p : partial) total += p;
  EXPECT_NEAR(total, 30 * 20.0 * omp_get_max_threads(), 1e-6 * total);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(1 << 16, 30.0f));
}

// Exit paths run in a fresh process (the "threadsafe" style re-executes this binary). Each is the bug the
// first version had: exit() while the worker is inside kernels whose first run creates oneDNN's statics
// (see runtime/exit_hook.h); several points in time are tried, from at once to well into the queue.
class CpuStreamExit : public CpuStream {
 protected:
  CpuStreamExit() { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Linear (oneDNN: engine, primitive cache, JIT on first use), then other kernels, then exit.
void queue_mixed_work() {
  Tensor w = Tensor::full({256, 256}, 0.01, bfloat16);
  Tensor x = Tensor::full({64, 256}, 1.0, bfloat16);
  for (int i = 0; i < 20; ++i) x = linear(x, w);
  run("runtime_test.sleep_write", {}, {Tensor::empty({1})}, 1, 20);
  for (int i = 0; i < 20; ++i) x = silu(add(x, 1.0));
  (void)softmax(x.to(float32), -1);
}

TEST_F(CpuStreamExit, ExitWithWorkQueuedIsClean) {
  for (int delay_ms : {0, 1, 5, 30}) {
    EXPECT_EXIT(
        {
          queue_mixed_work();
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          std::exit(3);
        },
        ::testing::ExitedWithCode(3), "")
        << "exit after " << delay_ms << " ms";
  }
}

TEST_F(CpuStreamExit, StaticsCreatedByARunningKernelOutliveIt) {
  // The race itself, made deterministic: exit() comes while a kernel uses a static that its own first run
  // created (so after any exit hook registered before it). The static must not be destroyed under it.
  EXPECT_EXIT(
      {
        run("runtime_test.lazy_static", {}, {Tensor::empty({1})}, /*value=*/9, /*ms=*/100);
        while (!runtime_test::lazy_static_created.load()) std::this_thread::yield();
        std::exit(3);
      },
      ::testing::ExitedWithCode(3), "");
}

TEST_F(CpuStreamExit, ReturnFromMainAfterTheWorkIsClean) {
  // A normal end: nothing queued, the worker asleep; exit must neither hang nor crash.
  EXPECT_EXIT(
      {
        queue_mixed_work();
        synchronize();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(CpuStreamExit, ExitFromAnotherThreadWithWorkQueuedIsClean) {
  EXPECT_EXIT(
      {
        std::thread([] {
          queue_mixed_work();
          std::exit(5);
        }).join();
        std::exit(1);  // not reached
      },
      ::testing::ExitedWithCode(5), "");
}

TEST_F(CpuStreamExit, ExitFromInsideAKernelIsClean) {
  EXPECT_EXIT(
      {
        queue_mixed_work();
        run("runtime_test.exit", {}, {Tensor::empty({1})}, 6);
        for (int i = 0; i < 10; ++i) (void)add(Tensor::zeros({4}), 1.0);
        // The ops behind the exiting kernel never run: synchronize reports that (or waits) while the
        // kernel's exit() ends the process.
        try {
          synchronize();
        } catch (const Error&) {
        }
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      },
      ::testing::ExitedWithCode(6), "");
}

TEST_F(CpuStreamExit, ExitWithAnUnreportedFailureIsClean) {
  EXPECT_EXIT(
      {
        run("runtime_test.fail", {}, {Tensor::empty({1})});
        std::exit(4);
      },
      ::testing::ExitedWithCode(4), "");
}

// fork() (the "fast" death-test style forks without exec): the child has no worker thread. It must get the
// results of ops queued before the fork, run new ops, and exit without waiting for the missing worker.
TEST_F(CpuStream, ForkedChildGetsQueuedResultsAndRunsNewOps) {
  GTEST_FLAG_SET(death_test_style, "fast");
  Tensor x = Tensor::zeros({1000});
  x = add(x, 1.0);
  synchronize();  // the worker exists and sleeps
  Tensor t = Tensor::zeros({8});
  run("runtime_test.sleep_write", {}, {t}, 7, 50);  // still queued or running at the fork
  EXPECT_EXIT(
      {
        const bool queued_result = static_cast<float*>(t.raw_data())[3] == 7.0f;  // no synchronisation
        Tensor y = x;
        for (int i = 0; i < 10; ++i) y = add(y, 1.0);
        const bool new_ops = y.to_vector<float>() == std::vector<float>(1000, 11.0f);
        std::exit(queued_result && new_ops ? 8 : 1);
      },
      ::testing::ExitedWithCode(8), "");
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(8, 7.0f));
  EXPECT_EQ(add(x, 1.0).to_vector<float>(), std::vector<float>(1000, 2.0f));  // the parent's worker goes on
}

}  // namespace
}  // namespace kiln
