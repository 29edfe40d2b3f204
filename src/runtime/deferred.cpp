#include "runtime/deferred.h"

#include <mutex>
#include <utility>
#include <vector>

#include "runtime/dispatcher.h"

namespace kiln::runtime {

namespace {

struct DeferredGraph {
  std::mutex mutex;
  std::vector<OpCall> calls;
};

DeferredGraph& deferred_graph() {
  static DeferredGraph* graph = new DeferredGraph;  // never destroyed: flushed from late destructors too
  return *graph;
}

std::vector<OpCall> take_calls(DeferredGraph& g) {
  std::lock_guard lock(g.mutex);
  return std::exchange(g.calls, {});
}

void run_calls(std::vector<OpCall> calls) {
  for (OpCall& c : calls) launch(std::move(c));
}

}  // namespace

void defer(OpCall call) {
  DeferredGraph& g = deferred_graph();
  std::vector<OpCall> full;
  {
    std::lock_guard lock(g.mutex);
    g.calls.push_back(std::move(call));
    if (g.calls.size() >= kMaxDeferredOps) full = std::exchange(g.calls, {});
  }
  if (!full.empty()) run_calls(std::move(full));
}

void flush_deferred() {
  std::vector<OpCall> calls = take_calls(deferred_graph());
  if (!calls.empty()) run_calls(std::move(calls));
}

size_t deferred_op_count() {
  DeferredGraph& g = deferred_graph();
  std::lock_guard lock(g.mutex);
  return g.calls.size();
}

}  // namespace kiln::runtime
