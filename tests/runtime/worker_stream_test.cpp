// WorkerStream on its own (a private instance, not the CPU device's): shutdown and destruction with work
// queued, and inline execution afterwards.
#include "runtime/worker_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/error.h"

namespace kiln::runtime {
namespace {

std::function<std::string()> named(const char* name) {
  return [name] { return std::string(name); };
}

TEST(WorkerStream, ShutdownFinishesTheRunningTaskAndDropsTheRest) {
  WorkerStream s;
  std::atomic<bool> started{false}, first_done{false};
  std::atomic<int> later{0};
  s.enqueue(
      [&] {
        started = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        first_done = true;
      },
      named("first"));
  for (int i = 0; i < 10; ++i) s.enqueue([&] { ++later; }, named("later"));
  while (!started) std::this_thread::yield();
  s.shutdown();
  EXPECT_TRUE(first_done.load());
  EXPECT_EQ(later.load(), 0);
  // After shutdown tasks run on the caller, and their failures are thrown there.
  const auto caller = std::this_thread::get_id();
  std::thread::id ran_on;
  s.enqueue([&] { ran_on = std::this_thread::get_id(); }, named("inline"));
  EXPECT_EQ(ran_on, caller);
  try {
    s.enqueue([] { throw Error("broken"); }, named("inline_fail(float32[1])"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "inline_fail(float32[1]): broken");
  }
  // A thread waiting for the dropped tasks is told once that they never ran.
  try {
    s.synchronize();
    FAIL() << "the dropped tasks were not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("before 10 queued ops ran, the first being later"),
              std::string::npos)
        << e.what();
  }
  s.synchronize();
  s.shutdown();  // idempotent
}

TEST(WorkerStream, DestructionWithWorkQueuedDoesNotHang) {
  std::atomic<int> ran{0};
  {
    WorkerStream s;
    for (int i = 0; i < 100; ++i)
      s.enqueue(
          [&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            ++ran;
          },
          named("t"));
  }
  EXPECT_LT(ran.load(), 100);
}

TEST(WorkerStream, TheFirstFailureIsReportedOnceAndLaterTasksAreSkipped) {
  WorkerStream s;
  std::vector<int> order;
  s.enqueue([&] { order.push_back(1); }, named("one"));
  s.enqueue([] { throw Error("first"); }, named("two"));
  s.enqueue([] { throw Error("second"); }, named("three"));
  s.enqueue([&] { order.push_back(4); }, named("four"));
  try {
    s.synchronize();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "two: first");
  }
  EXPECT_EQ(order, std::vector<int>{1});
  s.synchronize();  // nothing more to report
  s.enqueue([&] { order.push_back(5); }, named("five"));
  s.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 5}));
}

TEST(WorkerStream, SynchronizeOnTheWorkerDoesNotDeadlock) {
  WorkerStream s;
  bool inner_ran = false, on_worker = false;
  s.enqueue(
      [&] {
        on_worker = s.on_worker_thread();
        s.synchronize();
        s.enqueue([&] { inner_ran = true; }, named("inner"));  // runs at once, inline
      },
      named("outer"));
  s.synchronize();
  EXPECT_TRUE(on_worker);
  EXPECT_TRUE(inner_ran);
  EXPECT_FALSE(s.on_worker_thread());
}

}  // namespace
}  // namespace kiln::runtime
