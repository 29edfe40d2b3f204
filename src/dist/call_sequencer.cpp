#include "kiln/dist/call_sequencer.h"

#include <condition_variable>
#include <mutex>
#include <optional>

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

Sequencer& sequencer() {
  static Sequencer* s = new Sequencer;  // never destroyed: a turn may end during exit
  return *s;
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
  if (!is_initialized() || world_size() <= 1) return turn;
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
  if (!is_initialized() || world_size() <= 1) return mine;
  return any_rank_true(mine);
}

}  // namespace kiln::dist
