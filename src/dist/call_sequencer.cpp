#include "kiln/dist/call_sequencer.h"

#include <any>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "dist/local_group.h"
#include "dist/transport.h"
#include "kiln/dist/process_group.h"

namespace kiln::dist {

namespace {

struct Sequencer {
  std::mutex mutex;
  std::condition_variable changed;
  bool running = false;  // a call holds the turn
  // Rank 0: calls served in arrival order.
  uint64_t tickets = 0, serving = 0;
  // Other ranks: the key rank 0 admitted that no call here has taken yet, and whether a thread is inside the
  // broadcast that tells it (one at a time: each broadcast is one MPI call).
  std::optional<uint64_t> next;
  bool receiving = false;
};

// The sequencers of in-process ranks (kiln/dist/local_ranks.h): one per rank of each live group, the ranks
// being threads of this one process.
struct LocalSequencers {
  std::mutex mutex;
  std::map<std::pair<int64_t, int>, std::pair<std::weak_ptr<LocalGroup>, std::unique_ptr<Sequencer>>> by_rank;
};

Sequencer& sequencer() {
  const LocalRank* local = current_local_rank();
  if (local == nullptr) {
    static Sequencer* s = new Sequencer;  // never destroyed: a turn may end during exit
    return *s;
  }
  static LocalSequencers* all = new LocalSequencers;
  std::lock_guard lock(all->mutex);
  std::erase_if(all->by_rank, [](const auto& entry) { return entry.second.first.expired(); });
  auto& entry = all->by_rank[{local->group->id(), local->rank}];
  if (!entry.second) entry = {local->group, std::make_unique<Sequencer>()};
  return *entry.second;  // kept while the group lives, which the calling rank keeps alive
}

}  // namespace

CallTurn::~CallTurn() {
  if (!held_) return;
  Sequencer& s = sequencer();
  {
    std::lock_guard lock(s.mutex);
    s.running = false;
  }
  s.changed.notify_all();
}

CallTurn admit_call(uint64_t key) {
  CallTurn turn;
  if (world_size() <= 1) return turn;  // one rank: MPI not started, or a group of one
  Sequencer& s = sequencer();
  std::unique_lock lock(s.mutex);
  if (rank() == 0) {
    const uint64_t ticket = s.tickets++;
    s.changed.wait(lock, [&] { return !s.running && s.serving == ticket; });
    s.running = true;
    ++s.serving;
    turn.held_ = true;  // from here the turn is released however this ends
    lock.unlock();
    uint64_t announced = key;
    broadcast_from_rank0(&announced, sizeof announced);
    return turn;
  }
  for (;;) {
    if (!s.running && s.next && *s.next == key) {
      s.next.reset();
      s.running = true;
      turn.held_ = true;
      return turn;
    }
    if (!s.running && !s.next && !s.receiving) {
      s.receiving = true;
      lock.unlock();
      uint64_t announced = 0;
      try {
        broadcast_from_rank0(&announced, sizeof announced);
      } catch (...) {
        lock.lock();
        s.receiving = false;
        s.changed.notify_all();
        throw;
      }
      lock.lock();
      s.receiving = false;
      s.next = announced;
      s.changed.notify_all();
      continue;
    }
    s.changed.wait(lock);
  }
}

bool any_rank(bool mine) {
  if (world_size() <= 1) return mine;
  if (const LocalRank* local = current_local_rank()) {
    const std::any any = local->group->rendezvous(local->rank, mine, [](const std::vector<std::any>& items) {
      bool any = false;
      for (const std::any& item : items) any = any || std::any_cast<bool>(item);
      return std::vector<std::any>(items.size(), any);
    });
    return std::any_cast<bool>(any);
  }
  return any_rank_true(mine);
}

}  // namespace kiln::dist
