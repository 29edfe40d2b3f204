// kiln serve's jobs and their queue, with a stand-in for the pipeline: arrival order within a lane and lanes
// side by side, the bound (QueueFull with a Retry-After), queue positions as events, cancelling waiting and
// running jobs, the shutdown, and how many finished jobs are kept.
#include "cli/serve/job_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

namespace kiln::serve {
namespace {

using namespace std::chrono_literals;

GenerationParams params(const std::string& prompt) {
  GenerationParams p;
  p.request.prompt = prompt;
  return p;
}

// Stands in for the pipeline: each job runs until the test releases it (it then succeeds with one "PNG") or
// it is cancelled; records the order jobs start in.
class FakePipeline {
 public:
  void run(Job& job) {
    std::unique_lock lock(mutex_);
    started_.push_back(job.params().request.prompt);
    changed_.notify_all();
    // A cancellation comes through the job's token, as it does to a pipeline: looked at every few ms (a
    // step).
    while (!released_.count(job.params().request.prompt) && !job.cancel_token().cancelled())
      changed_.wait_for(lock, 5ms);
    lock.unlock();
    if (job.cancel_token().cancelled())
      job.cancelled();
    else
      job.succeeded({"png of " + job.params().request.prompt});
  }
  void release(const std::string& prompt) {
    std::lock_guard lock(mutex_);
    released_.insert(prompt);
    changed_.notify_all();
  }
  // Waits until `n` jobs have started; returns their prompts in start order.
  std::vector<std::string> wait_started(size_t n) {
    std::unique_lock lock(mutex_);
    EXPECT_TRUE(changed_.wait_for(lock, 10s, [&] { return started_.size() >= n; }))
        << "fewer than " << n << " started";
    return started_;
  }
  std::vector<std::string> started() {
    std::lock_guard lock(mutex_);
    return started_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> started_;
  std::set<std::string> released_;
};

struct Fixture {
  FakePipeline pipeline;
  std::atomic<int> ended{0};
  JobQueue queue;
  // Models "a..." run in lane 0, models "b..." in lane 1.
  Fixture(QueueOptions options, size_t lanes)
      : queue(
            options, lanes, [](const std::string& model) { return model[0] == 'b' ? size_t{1} : size_t{0}; },
            [this](Job& job) { pipeline.run(job); }, [this](const Job&) { ++ended; }) {}
};

bool ends_within(const Job& job, std::chrono::milliseconds limit = 10s) {
  return job.wait_finished(limit);
}

// Waits (up to 10 s) for the queue to have reported `n` ended jobs: it does so just after each job ends.
void wait_ended(const Fixture& f, int n) {
  for (int i = 0; i < 1000 && f.ended.load() < n; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(f.ended.load(), n);
}

TEST(JobQueue, RunsEachLaneInArrivalOrderAndLanesSideBySide) {
  Fixture f({.capacity = 8}, 2);
  const auto a1 = f.queue.submit("a", params("a1"), 1);
  const auto a2 = f.queue.submit("a", params("a2"), 2);
  const auto b1 = f.queue.submit("b", params("b1"), 3);
  const std::vector<std::string> first = f.pipeline.wait_started(2);
  EXPECT_EQ(std::set<std::string>(first.begin(), first.end()), (std::set<std::string>{"a1", "b1"}));
  EXPECT_EQ(f.queue.running(), 2u);
  EXPECT_EQ(f.queue.waiting(), 1u);
  EXPECT_EQ(a2->snapshot().status, JobStatus::Queued);
  EXPECT_EQ(a2->snapshot().position, 0u);  // next in its lane
  f.pipeline.release("a1");
  EXPECT_EQ(f.pipeline.wait_started(3).back(), "a2");
  f.pipeline.release("a2");
  f.pipeline.release("b1");
  for (const auto& job : {a1, a2, b1}) {
    ASSERT_TRUE(ends_within(*job));
    EXPECT_EQ(job->snapshot().status, JobStatus::Succeeded);
  }
  EXPECT_EQ(*a2->png(0), "png of a2");
  EXPECT_EQ(a2->png(1), nullptr);
  EXPECT_EQ(a2->image_path(0), "/v1/jobs/" + a2->id() + "/images/0.png");
  wait_ended(f, 3);
}

TEST(JobQueue, RefusesJobsBeyondItsCapacityWithARetryAfter) {
  Fixture f({.capacity = 2}, 1);
  const auto running = f.queue.submit("a", params("r"), 0);
  f.pipeline.wait_started(1);
  f.queue.submit("a", params("w1"), 0);
  f.queue.submit("a", params("w2"), 0);
  try {
    f.queue.submit("a", params("w3"), 0);
    FAIL() << "a third waiting job was accepted by a queue of 2";
  } catch (const QueueFull& e) {
    EXPECT_NE(std::string(e.what()).find("2 jobs are waiting (--queue 2)"), std::string::npos) << e.what();
    EXPECT_GE(e.retry_after(), 1);
    EXPECT_LE(e.retry_after(), 3600);
  }
  // A running job does not count: once one starts, there is room again.
  f.pipeline.release("r");
  f.pipeline.wait_started(2);
  EXPECT_NO_THROW(f.queue.submit("a", params("w3"), 0));
  for (const char* p : {"w1", "w2", "w3"}) f.pipeline.release(p);
}

TEST(JobQueue, PublishesEachWaitingJobsPosition) {
  Fixture f({.capacity = 8}, 1);
  f.queue.submit("a", params("r"), 0);
  f.pipeline.wait_started(1);
  const auto w1 = f.queue.submit("a", params("w1"), 0);
  const auto w2 = f.queue.submit("a", params("w2"), 0);
  EXPECT_EQ(w2->snapshot().position, 1u);
  f.pipeline.release("r");
  f.pipeline.wait_started(2);
  f.pipeline.release("w1");
  f.pipeline.release("w2");
  ASSERT_TRUE(ends_within(*w2));
  // w2: queued at 1, then at 0, then running and done.
  std::vector<std::string> names;
  std::vector<nlohmann::json> data;
  for (const JobEvent& e : w2->events_after(0, 0ms)) {
    names.push_back(e.name);
    data.push_back(nlohmann::json::parse(e.data));
  }
  ASSERT_EQ(names, (std::vector<std::string>{"queued", "queued", "running", "done"}));
  EXPECT_EQ(data[0]["position"], 1);
  EXPECT_EQ(data[1]["position"], 0);
  EXPECT_EQ(data[3]["images"], nlohmann::json::array({w2->image_path(0)}));
  EXPECT_EQ(data[3]["seed"], 0);
  // Nothing after the last event: a wait times out empty.
  EXPECT_TRUE(w2->events_after(4, 10ms).empty());
  EXPECT_EQ(w1->events_after(0, 0ms).front().name, "queued");
}

TEST(JobQueue, CancelsAWaitingJobAtOnceAndARunningOneAtItsNextStep) {
  Fixture f({.capacity = 8}, 1);
  const auto running = f.queue.submit("a", params("r"), 0);
  f.pipeline.wait_started(1);
  const auto waiting = f.queue.submit("a", params("w"), 0);
  EXPECT_TRUE(f.queue.cancel(waiting->id(), {499, "cancelled", "", "cancelled by the test"}));
  EXPECT_EQ(waiting->snapshot().status, JobStatus::Cancelled);  // at once
  EXPECT_EQ(waiting->snapshot().error->message, "cancelled by the test");
  EXPECT_EQ(f.queue.waiting(), 0u);
  EXPECT_TRUE(f.queue.cancel(running->id(), {499, "cancelled", "", "stop it"}));
  ASSERT_TRUE(ends_within(*running));
  EXPECT_EQ(running->snapshot().status, JobStatus::Cancelled);
  EXPECT_EQ(running->snapshot().error->message, "stop it");
  EXPECT_EQ(running->events_after(0, 0ms).back().name, "cancelled");
  // Ended jobs cannot be cancelled again; unknown ones are not found.
  EXPECT_FALSE(f.queue.cancel(running->id(), {}));
  EXPECT_FALSE(f.queue.cancel("job_0000", {}));
  EXPECT_EQ(f.pipeline.started(), std::vector<std::string>{"r"});  // the waiting job never ran
  wait_ended(f, 2);
}

TEST(JobQueue, ShutdownCancelsEverythingAndRefusesNewJobs) {
  Fixture f({.capacity = 8}, 2);
  const auto a = f.queue.submit("a", params("a"), 0);
  const auto b = f.queue.submit("b", params("b"), 0);
  const auto waiting = f.queue.submit("a", params("w"), 0);
  f.pipeline.wait_started(2);
  f.queue.shutdown({503, "server_error", "", "the server is shutting down"});
  for (const auto& job : {a, b, waiting}) {
    EXPECT_TRUE(job->finished());  // shutdown() waited for the workers
    EXPECT_EQ(job->snapshot().status, JobStatus::Cancelled);
    EXPECT_EQ(job->snapshot().error->http_status, 503);
  }
  EXPECT_THROW(f.queue.submit("a", params("late"), 0), ShuttingDown);
  EXPECT_EQ(f.ended.load(), 3);
  f.queue.shutdown({});  // again: nothing more
}

TEST(JobQueue, KeepsTheNewestFinishedJobsAndFreshIds) {
  Fixture f({.capacity = 8, .keep_finished = 2}, 1);
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 4; ++i) {
    const std::string name = "j" + std::to_string(i);
    f.pipeline.release(name);
    jobs.push_back(f.queue.submit("a", params(name), 0));
    ASSERT_TRUE(ends_within(*jobs.back()));
  }
  wait_ended(f, 4);  // ended jobs are kept once their on_end has run, just after they end
  EXPECT_EQ(f.queue.find(jobs[0]->id()), nullptr);
  EXPECT_EQ(f.queue.find(jobs[1]->id()), nullptr);
  EXPECT_EQ(f.queue.find(jobs[2]->id()), jobs[2]);
  EXPECT_EQ(f.queue.find(jobs[3]->id()), jobs[3]);
  std::set<std::string> ids;
  for (const auto& job : jobs) {
    EXPECT_EQ(job->id().rfind("job_", 0), 0u);
    EXPECT_EQ(job->id().size(), 20u);
    ids.insert(job->id());
  }
  EXPECT_EQ(ids.size(), 4u);
}

TEST(Job, ReportsItsProgressAndFailure) {
  Job job("job_1", "m", params("p"), 42);
  job.queued_at(3);
  job.queued_at(3);  // no change, no event
  job.started();
  job.stepped(1, 4, 0.5);
  job.failed({500, "server_error", "", "out of memory"});
  const Job::Snapshot s = job.snapshot();
  EXPECT_EQ(s.status, JobStatus::Failed);
  EXPECT_EQ(s.step, 1);
  EXPECT_EQ(s.steps, 4);
  EXPECT_EQ(s.error->message, "out of memory");
  EXPECT_EQ(job.png(0), nullptr);
  const std::vector<JobEvent> events = job.events_after(0, 0ms);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(nlohmann::json::parse(events[2].data),
            nlohmann::json({{"step", 1}, {"steps", 4}, {"seconds", 0.5}}));
  EXPECT_EQ(events[3].name, "failed");
  EXPECT_EQ(nlohmann::json::parse(events[3].data)["error"]["message"], "out of memory");
  EXPECT_TRUE(job.wait_finished(0ms));
}

}  // namespace
}  // namespace kiln::serve
