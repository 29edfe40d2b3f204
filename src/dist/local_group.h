// The in-process rank group behind run_local_ranks (kiln/dist/local_ranks.h): its threads meet at each
// collective (a rendezvous per call, in the order every rank makes them), the last to arrive combines what
// all brought, and each leaves with its share. A rank that fails marks the group failed, which wakes every
// waiter with an error naming it.
//
// Collective kernels run on the device streams' worker threads, not on the rank threads, so a collective
// op's call carries its group and rank as attributes (set by the op's front end on the rank thread;
// collective_attrs) and the kernel finds the group from them (local_rank_of).
#pragma once

#include <any>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace kiln::runtime {
class Attrs;
}

namespace kiln::dist {

class LocalGroup {
 public:
  explicit LocalGroup(int size);
  int size() const { return size_; }
  int64_t id() const { return id_; }

  // Rank `rank`'s part in its next collective: blocks until every rank has brought its `item`; the last to
  // arrive runs `combine` on all items (in rank order), which returns one result per rank; returns this
  // rank's. An exception from `combine` is every rank's. Throws when the group has failed.
  using Combine = std::function<std::vector<std::any>(const std::vector<std::any>& items)>;
  std::any rendezvous(int rank, std::any item, const Combine& combine);

  // Marks the group failed (the first call's message is kept): every rendezvous, waiting or to come, throws.
  void fail(int rank, const std::string& message);
  // The failure fail() recorded (the message naming the rank), if any.
  std::optional<std::string> failure();

 private:
  struct Round {
    std::vector<std::any> items;
    int arrived = 0;
    int taken = 0;
    bool done = false;
    std::vector<std::any> results;
    std::string error;  // combine's failure
  };
  [[noreturn]] void throw_failed(int rank) const;

  const int size_;
  const int64_t id_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int64_t> next_round_;  // per rank: the number of its next collective
  std::map<int64_t, Round> rounds_;
  std::optional<std::string> failure_;
};

// The calling thread's place in an in-process group (set by run_local_ranks on each rank thread).
struct LocalRank {
  std::shared_ptr<LocalGroup> group;
  int rank = 0;
};
const LocalRank* current_local_rank();

// For the collective ops' front ends: records the calling thread's group and rank in `attrs` when it is a
// rank of an in-process group (nothing otherwise: the call goes to the MPI process group).
void collective_attrs(runtime::Attrs& attrs);
// For their kernels: the group and rank `attrs` name, or nullopt for the MPI process group. Throws when the
// group has gone (its run_local_ranks returned).
std::optional<LocalRank> local_rank_of(const runtime::Attrs& attrs);

}  // namespace kiln::dist
