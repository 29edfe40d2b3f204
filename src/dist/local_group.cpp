#include "dist/local_group.h"

#include <atomic>
#include <exception>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/dist/local_ranks.h"
#include "kiln/dist/process_group.h"
#include "kiln/runtime/execution_context.h"
#include "runtime/op_call.h"

namespace kiln::dist {

namespace {

thread_local const LocalRank* t_local_rank = nullptr;

// Live groups by id, for the kernels (which get an id from the call's attributes).
struct Registry {
  std::mutex mutex;
  std::map<int64_t, std::weak_ptr<LocalGroup>> groups;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: a kernel may look up during exit
  return *r;
}

int64_t next_group_id() {
  static std::atomic<int64_t> next{1};
  return next++;
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

LocalGroup::LocalGroup(int size) : size_(size), id_(next_group_id()), next_round_(size_t(size), 0) {}

void LocalGroup::throw_failed(int rank) const {
  KILN_FAIL("rank " << rank << " of the in-process group of " << size_ << ": " << *failure_);
}

std::any LocalGroup::rendezvous(int rank, std::any item, const Combine& combine) {
  KILN_CHECK(rank >= 0 && rank < size_, "internal: rank " << rank << " outside a group of " << size_);
  std::unique_lock lock(mutex_);
  if (failure_) throw_failed(rank);
  const int64_t number = next_round_[size_t(rank)]++;
  Round& round = rounds_[number];
  if (round.items.empty()) round.items.resize(size_t(size_));
  round.items[size_t(rank)] = std::move(item);
  if (++round.arrived == size_) {
    // The last to arrive combines, outside the lock (a device executable may compile and run meanwhile).
    lock.unlock();
    std::vector<std::any> results;
    std::string error;
    try {
      results = combine(round.items);
      KILN_CHECK(results.size() == size_t(size_), "internal: a collective combined "
                                                      << results.size() << " results for " << size_
                                                      << " ranks");
    } catch (const std::bad_any_cast&) {
      // One rank's item is not what the others' collective takes: they are in different calls.
      error = "the ranks of the in-process group of " + std::to_string(size_) +
              " are in different collectives (call " + std::to_string(number + 1) +
              "): every rank must make the same collective calls in the same order";
    } catch (const std::exception& e) {
      error = e.what();
    }
    lock.lock();
    round.results = std::move(results);
    round.error = std::move(error);
    round.done = true;
    changed_.notify_all();
  } else {
    changed_.wait(lock, [&] { return round.done || failure_.has_value(); });
    if (!round.done) throw_failed(rank);
  }
  std::any mine = round.error.empty() ? std::move(round.results[size_t(rank)]) : std::any();
  const std::string error = round.error;
  if (++round.taken == size_) rounds_.erase(number);
  KILN_CHECK(error.empty(), error);
  return mine;
}

void LocalGroup::fail(int rank, const std::string& message) {
  std::lock_guard lock(mutex_);
  if (!failure_) failure_ = "rank " + std::to_string(rank) + " failed: " + message;
  changed_.notify_all();
}

std::optional<std::string> LocalGroup::failure() {
  std::lock_guard lock(mutex_);
  return failure_;
}

const LocalRank* current_local_rank() {
  return t_local_rank;
}

std::optional<std::string> local_group_failure() {
  if (t_local_rank == nullptr) return std::nullopt;
  return t_local_rank->group->failure();
}

bool in_local_ranks() {
  return t_local_rank != nullptr;
}

std::function<void(const std::function<void()>&)> as_this_rank() {
  if (t_local_rank == nullptr) return [](const std::function<void()>& work) { work(); };
  // The copy holds the group alive; the pointer the thread sees is to it, for as long as the function lives.
  auto mine = std::make_shared<const LocalRank>(*t_local_rank);
  return [mine](const std::function<void()>& work) {
    struct Restore {
      const LocalRank* saved;
      ~Restore() { t_local_rank = saved; }
    } restore{t_local_rank};
    t_local_rank = mine.get();
    work();
  };
}

void collective_attrs(runtime::Attrs& attrs) {
  // One attribute, [group id, rank]: the collective's call has room for it without growing twice.
  if (const LocalRank* local = t_local_rank)
    attrs.set("local_rank", std::vector<int64_t>{local->group->id(), int64_t(local->rank)});
}

std::optional<LocalRank> local_rank_of(const runtime::Attrs& attrs) {
  if (!attrs.has("local_rank")) return std::nullopt;
  const std::vector<int64_t>& group_and_rank = attrs.get_ints("local_rank");
  const int64_t id = group_and_rank.at(0);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.groups.find(id);
  std::shared_ptr<LocalGroup> group = it == r.groups.end() ? nullptr : it->second.lock();
  KILN_CHECK(group,
             "a collective of in-process rank group " << id << " ran after its run_local_ranks returned");
  return LocalRank{std::move(group), static_cast<int>(group_and_rank.at(1))};
}

void run_local_ranks(int n, const std::function<void(int rank)>& fn) {
  KILN_CHECK(n >= 1, "run_local_ranks: " << n << " ranks; give at least 1");
  KILN_CHECK(!in_local_ranks(), "run_local_ranks: called from a rank of another in-process group");
  KILN_CHECK(!(is_initialized() && world_size() > 1),
             "run_local_ranks: this process is already one rank of an MPI process group of "
                 << world_size() << "; in-process ranks and MPI ranks do not combine");
  auto group = std::make_shared<LocalGroup>(n);
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    r.groups[group->id()] = group;
  }
  std::mutex failure_mutex;
  std::exception_ptr first_failure;
  std::vector<std::thread> threads;
  threads.reserve(size_t(n));
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      const LocalRank mine{group, rank};
      t_local_rank = &mine;
      try {
        // A context per rank: its own streams, so no rank's collective queues behind another's on a shared
        // worker (the ranks' pipelines bring contexts of their own too).
        const auto context =
            ExecutionContext::create("rank " + std::to_string(rank) + " of " + std::to_string(n));
        ExecutionScope in(*context);
        fn(rank);
      } catch (...) {
        const std::exception_ptr e = std::current_exception();
        {
          std::lock_guard lock(failure_mutex);
          if (!first_failure) first_failure = e;
        }
        group->fail(rank, message_of(e));
      }
      t_local_rank = nullptr;
    });
  }
  for (std::thread& t : threads) t.join();
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    r.groups.erase(group->id());
  }
  if (first_failure) std::rethrow_exception(first_failure);
}

}  // namespace kiln::dist
