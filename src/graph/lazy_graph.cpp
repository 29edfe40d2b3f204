// An execution context's deferred graph (runtime/deferred.h, runtime/context_state.h): records op calls,
// spots repeating blocks, and at a flush plans them (graph/graph_plan.h) and launches the plan on the
// context's streams.
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graph/cpu_jit.h"
#include "graph/fused_launch.h"
#include "graph/graph_plan.h"
#include "graph/region_launch.h"
#include "kiln/core/log.h"
#include "kiln/runtime/execution_context.h"
#include "runtime/context_state.h"
#include "runtime/counter_updates.h"
#include "runtime/deferred.h"
#include "runtime/dispatcher.h"

namespace kiln::graph {

namespace {

using runtime::OpCall;

// Spots the end of a repeating block: the newest `p` recorded calls have the same structure as the `p` just
// before them. Calls are compared by a structural hash (op, attributes' names, operand shapes and dtypes),
// kept across flushes so that the second block already ends a graph.
class RepeatDetector {
 public:
  // Records one call's hash; returns the block length when the newest calls just completed a repeat of at
  // least kMinBlock calls, else 0.
  size_t push(uint64_t h) {
    if (history_.size() >= kHistory) {
      history_.erase(history_.begin(), history_.begin() + static_cast<std::ptrdiff_t>(kHistory / 2));
      last_seen_.clear();
      for (size_t i = 0; i < history_.size(); ++i) remember(history_[i], i);
    }
    const size_t i = history_.size();
    history_.push_back(h);
    size_t found = 0;
    auto it = last_seen_.find(h);
    if (it != last_seen_.end()) {
      for (size_t j : it->second) {
        const size_t p = i - j;
        if (p < kMinBlock || i + 1 < 2 * p) continue;
        bool same = true;
        for (size_t k = 0; k < p && same; ++k) same = history_[i - k] == history_[i - p - k];
        if (same) {
          found = p;
          break;
        }
      }
    }
    remember(h, i);
    return found;
  }

 private:
  static constexpr size_t kHistory = 1 << 14;
  static constexpr size_t kMinBlock = 8;
  static constexpr size_t kCandidates = 8;  // earlier occurrences of a hash tried as block starts

  void remember(uint64_t h, size_t i) {
    auto& v = last_seen_[h];
    v.insert(v.begin(), i);
    if (v.size() > kCandidates) v.pop_back();
  }

  std::vector<uint64_t> history_;
  std::unordered_map<uint64_t, std::vector<size_t>> last_seen_;  // newest first
};

uint64_t structural_hash(const OpCall& c) {
  uint64_t h = fnv1a64(c.op.data(), c.op.size());
  auto mix = [&](const void* p, size_t n) { h = fnv1a64(p, n, h); };
  for (const auto& [name, value] : c.attrs.items()) mix(name.data(), name.size());
  for (const auto* list : {&c.inputs, &c.outputs})
    for (const Tensor& t : *list) {
      if (!t.defined()) continue;
      const int d = static_cast<int>(t.dtype());
      mix(&d, sizeof d);
      mix(t.shape().data(), t.shape().size() * sizeof(int64_t));
    }
  return h;
}

void launch_group(const std::shared_ptr<FusedGroup>& group) {
  std::shared_ptr<const FusedKernel> kernel = CpuJit::global().kernel(group->region);
  if (!kernel) {  // no compiler (warned once): the calls run as recorded
    for (OpCall& c : group->members) runtime::launch(std::move(c));
    return;
  }
  launch_fused(std::move(kernel), std::shared_ptr<const ElementwiseRegion>(group, &group->region),
               group->scalars, group->inputs, group->outputs, [group] { return group->describe(); });
}

void run_graph(std::vector<OpCall> calls) {
  PlanStats stats;
  std::vector<PlanStep> plan =
      plan_graph(std::move(calls), {.weight_group_of = current_weight_groups()}, &stats);
  runtime::count_graph_flush(stats.dead + stats.common, stats.fused_calls + stats.region_calls,
                             stats.patterns);
  if (log_enabled("graph")) {
    std::string text = "flush of " + std::to_string(stats.calls) +
                       " op calls: " + std::to_string(stats.dead) + " dead, " + std::to_string(stats.common) +
                       " duplicates, " + std::to_string(stats.fused_calls) + " fused into " +
                       std::to_string(stats.fused_kernels) + " kernels, " + std::to_string(stats.patterns) +
                       " chains into fused ops, " + std::to_string(stats.region_calls) + " into " +
                       std::to_string(stats.regions) + " device regions";
    for (const PlanStep& step : plan)
      text += "\n  " + (step.fused    ? step.fused->describe()
                        : step.region ? step.region->describe()
                                      : step.call.describe());
    log("graph", text);
  }
  for (PlanStep& step : plan) {
    if (step.region)
      launch_region(std::move(step.region));
    else if (step.fused)
      launch_group(step.fused);
    else
      runtime::launch(std::move(step.call));
  }
}

class LazyGraph final : public runtime::DeferredGraph, public std::enable_shared_from_this<LazyGraph> {
 public:
  explicit LazyGraph(ExecutionContext& context) : context_(context) {}

  void record(OpCall call) override {
    std::lock_guard lock(mutex_);
    if (flush_before_ > 0) {
      std::vector<OpCall> ready(
          std::make_move_iterator(calls_.begin()),
          std::make_move_iterator(calls_.begin() + static_cast<std::ptrdiff_t>(flush_before_)));
      calls_.erase(calls_.begin(), calls_.begin() + static_cast<std::ptrdiff_t>(flush_before_));
      flush_before_ = 0;
      run(std::move(ready));
    }
    const size_t block = repeats_.push(structural_hash(call));
    for (const Tensor& t : call.outputs)
      if (t.defined()) t.storage()->set_pending_write(weak_from_this());
    calls_.push_back(std::move(call));
    if (calls_.size() >= runtime::kMaxDeferredOps || (block > 0 && calls_.size() >= block))
      flush_before_ = calls_.size();
  }

  void flush() override {
    std::lock_guard lock(mutex_);
    flush_before_ = 0;
    if (!calls_.empty()) run(std::exchange(calls_, {}));
  }

  size_t size() override {
    std::lock_guard lock(mutex_);
    return calls_.size();
  }

  // A host read of a tensor it computes: everything recorded runs, then the reader waits for the stream.
  void wait() override { context_.synchronize_all(); }

 private:
  // The plan runs in the graph's own context, whoever triggered the flush (a host read from another thread).
  void run(std::vector<OpCall> calls) {
    ExecutionScope in(context_);
    run_graph(std::move(calls));
  }

  ExecutionContext& context_;
  // Recursive: a kernel launched by a flush may read a tensor on the host, which flushes again (finding
  // nothing new). Held while a flush launches its plan, so concurrent flushes cannot reorder work.
  std::recursive_mutex mutex_;
  std::vector<OpCall> calls_;
  RepeatDetector repeats_;
  // When a block boundary or the size cap is reached, the calls before it are flushed at the NEXT record:
  // by then the code that recorded the block has usually returned, so its local temporaries are gone and
  // the plan can see that nothing outside the graph reads them.
  size_t flush_before_ = 0;
};

}  // namespace

}  // namespace kiln::graph

namespace kiln::runtime {

std::shared_ptr<DeferredGraph> make_deferred_graph(ExecutionContext& context) {
  return std::make_shared<graph::LazyGraph>(context);
}

}  // namespace kiln::runtime
