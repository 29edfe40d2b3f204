// The order in which tensor-parallel calls run on every rank. Each rank runs the same program on its shards,
// and the collectives of one call must meet their peers of the same call: if two threads of a rank both ran
// pipeline calls, the ranks could reach their collectives in different orders and exchange the wrong tensors
// or wait forever. So, under a process group of several ranks, TP calls run one at a time per process, and
// every rank runs them in the order rank 0 admits them: rank 0 admits calls in arrival order and broadcasts
// each one's key; another rank admits the waiting call with that key (waiting for it to arrive if need be).
// A key identifies a call's inputs (kiln/pipelines: a hash of the request), so identical calls on different
// threads are interchangeable: they produce the same result.
//
// Every rank must make the same calls (tensor parallelism is one program on all ranks); a rank whose calls
// never include a key rank 0 admitted waits for it. In-process ranks (kiln/dist/local_ranks.h) are sequenced
// the same way, each rank thread (or a thread acting as it: as_this_rank) with its own order.
#pragma once

#include <cstdint>

namespace kiln::dist {

class CallTurn {
 public:
  CallTurn() = default;
  CallTurn(CallTurn&& other) noexcept : held_(other.held_) { other.held_ = false; }
  CallTurn& operator=(CallTurn&&) = delete;
  ~CallTurn();  // lets the next call run

 private:
  friend CallTurn admit_call(uint64_t key);
  bool held_ = false;
};

// Blocks until the call with `key` may run (see above); returns at once without a process group of several
// ranks. Throws kiln::Error when the broadcast fails.
CallTurn admit_call(uint64_t key);

// Whether any rank says `mine` is true (a logical or over MPI, or over the in-process ranks): so that a call
// cancelled on one rank stops on every rank at the same step. `mine` without a process group of several
// ranks. Call it from the host thread with no collectives queued (after a synchronisation).
bool any_rank(bool mine);

}  // namespace kiln::dist
