#include "graph/graph_plan.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "graph/fusion_patterns.h"
#include "graph/fusion_rules.h"
#include "graph/graph_facts.h"
#include "kiln/runtime/execution_context.h"
#include "kiln/runtime/memory_policy.h"
#include "runtime/backend.h"

namespace kiln::graph {

namespace {

using runtime::OpCall;

// ---- common subexpressions

void append_view(std::ostringstream& k, const Tensor& t) {
  if (!t.defined()) {
    k << "none;";
    return;
  }
  k << static_cast<const void*>(sid(t)) << '@' << t.offset() << ':' << static_cast<int>(t.dtype())
    << shape_str(t.shape()) << shape_str(t.strides()) << ';';
}

std::string call_key(const OpCall& c) {
  std::ostringstream k;
  k.precision(17);
  k << c.op << '|';
  for (const auto& [name, value] : c.attrs.items()) {
    k << name << '=';
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
            k << shape_str(v);
          } else {
            k << v;
          }
        },
        value);
    k << ',';
  }
  k << '|';
  for (const Tensor& t : c.inputs) append_view(k, t);
  k << "->";
  for (const Tensor& t : c.outputs)
    k << (t.defined() ? std::to_string(static_cast<int>(t.dtype())) + shape_str(t.shape()) +
                            shape_str(t.strides()) + "@" + std::to_string(t.offset())
                      : "none")
      << ';';
  return k.str();
}

// Whether every output of `c` is made by `c` alone, in the graph, and unseen outside it.
bool outputs_private(const OpCall& c, const Facts& facts, int index) {
  if (c.outputs.empty()) return false;
  for (const Tensor& t : c.outputs)
    if (!is_private(facts, t, index)) return false;
  return true;
}

void eliminate_common(std::vector<OpCall>& calls, std::vector<bool>& removed, Facts& facts, int64_t& count) {
  std::unordered_map<std::string, int> seen;
  for (int i = 0; i < static_cast<int>(calls.size()); ++i) {
    OpCall& c = calls[i];
    if (c.outputs.empty() || !c.may_merge) continue;
    const std::string key = call_key(c);
    auto [it, inserted] = seen.try_emplace(key, i);
    if (inserted) continue;
    const int first = it->second;
    if (!outputs_private(c, facts, i) || !outputs_private(calls[first], facts, first) ||
        written_between(facts, c.inputs, first, i)) {
      it->second = i;  // later duplicates compare with this one
      continue;
    }
    // Readers of c's outputs read the first call's instead (same shape, dtype and layout: part of the key).
    for (size_t o = 0; o < c.outputs.size(); ++o) {
      const Storage* dup = sid(c.outputs[o]);
      const Tensor& keep = calls[first].outputs[o];
      StorageFacts& dup_facts = facts.at(dup);
      StorageFacts& keep_facts = facts.at(sid(keep));
      for (int r : dup_facts.readers) {
        for (Tensor& t : calls[r].inputs)
          if (t.defined() && sid(t) == dup)
            t = Tensor(keep.storage(), t.shape(), t.strides(), t.offset(), t.dtype());
        keep_facts.readers.push_back(r);
      }
      std::sort(keep_facts.readers.begin(), keep_facts.readers.end());
      keep_facts.readers.erase(std::unique(keep_facts.readers.begin(), keep_facts.readers.end()),
                               keep_facts.readers.end());
      dup_facts.readers.clear();
    }
    removed[i] = true;
    ++count;
  }
}

// The calls not removed, in order (dropping the removed ones' references to their tensors).
std::vector<OpCall> compact(std::vector<OpCall> calls, const std::vector<bool>& removed) {
  std::vector<OpCall> kept;
  kept.reserve(calls.size());
  for (size_t i = 0; i < calls.size(); ++i)
    if (!removed[i]) kept.push_back(std::move(calls[i]));
  return kept;
}

// ---- dead code

void eliminate_dead(const std::vector<OpCall>& calls, std::vector<bool>& removed, const Facts& facts,
                    int64_t& count) {
  // Walking backwards, a call is live when one of its outputs is seen outside the graph, was not made in the
  // graph (it writes into an existing tensor), or is read by a later live call.
  std::unordered_set<const Storage*> read_later;
  for (int i = static_cast<int>(calls.size()) - 1; i >= 0; --i) {
    if (removed[i]) continue;
    const OpCall& c = calls[i];
    bool live = c.outputs.empty();
    for (const Tensor& t : c.outputs) {
      if (!t.defined()) continue;
      const StorageFacts& f = facts.at(sid(t));
      live = live || f.external || !f.fresh || read_later.count(sid(t)) > 0;
    }
    if (!live) {
      removed[i] = true;
      ++count;
      continue;
    }
    for (const Tensor& t : c.inputs)
      if (t.defined()) read_later.insert(sid(t));
  }
}

// ---- fusion

// A run of consecutive fusable calls being considered for one region.
class GroupBuilder {
 public:
  GroupBuilder(const std::vector<OpCall>& calls, const Facts& facts) : calls_(calls), facts_(facts) {}

  bool empty() const { return members_.empty(); }
  const std::vector<int>& members() const { return members_; }

  // Adds call i when its reads of values made in the group are plain (or broadcast) views of them, it does
  // not overwrite memory the group reads, and its shape broadcasts with the group's.
  bool try_add(int i) {
    const OpCall& c = calls_[i];
    if (!members_.empty()) {
      // Only connected calls join: unrelated small ops fused side by side save little and would make a new
      // kernel for every combination.
      bool connected = false;
      for (const Tensor& t : c.inputs)
        connected = connected || written_.count(sid(t)) || read_from_memory_.count(sid(t));
      if (!connected) return false;
    }
    for (const Tensor& t : c.inputs) {
      auto it = written_.find(sid(t));
      if (it == written_.end()) continue;
      const Tensor& made = calls_[it->second].outputs[0];
      if (same_view(t, made)) continue;
      if (!expands_to(made.shape(), t.shape())) return false;
      if (!same_view(t, made.expand(t.shape()))) return false;
    }
    const Tensor& out = c.outputs[0];
    if (read_from_memory_.count(sid(out)) || written_.count(sid(out))) return false;
    if (!members_.empty() && !broadcastable(shape_, out.shape())) return false;
    for (const Tensor& t : c.inputs)
      if (!written_.count(sid(t))) read_from_memory_.insert(sid(t));
    written_[sid(out)] = i;
    shape_ = members_.empty() ? out.shape() : broadcast_shapes(shape_, out.shape(), "fusion");
    members_.push_back(i);
    return true;
  }

  void clear() {
    members_.clear();
    written_.clear();
    read_from_memory_.clear();
    shape_.clear();
  }

 private:
  // Whether `from` broadcasts to exactly `to` (Tensor::expand would accept it).
  static bool expands_to(const Shape& from, const Shape& to) {
    if (from.size() > to.size()) return false;
    for (size_t k = 0; k < from.size(); ++k) {
      const int64_t f = from[from.size() - 1 - k], t = to[to.size() - 1 - k];
      if (f != t && f != 1) return false;
    }
    return true;
  }
  static bool broadcastable(const Shape& a, const Shape& b) {
    const size_t n = std::max(a.size(), b.size());
    for (size_t k = 0; k < n; ++k) {
      const int64_t x = k < a.size() ? a[a.size() - 1 - k] : 1, y = k < b.size() ? b[b.size() - 1 - k] : 1;
      if (x != y && x != 1 && y != 1) return false;
    }
    return true;
  }

  const std::vector<OpCall>& calls_;
  const Facts& facts_;
  std::vector<int> members_;
  std::unordered_map<const Storage*, int> written_;  // storage -> the member that makes it
  std::unordered_set<const Storage*> read_from_memory_;
  Shape shape_;
};

// Whether member m's value must be stored: seen outside, not made in the graph, or read by a call outside
// members[0, count).
bool must_store(int m, const std::vector<int>& members, size_t count, const std::vector<OpCall>& calls,
                const std::vector<bool>& removed, const Facts& facts) {
  const StorageFacts& f = facts.at(sid(calls[m].outputs[0]));
  if (f.external || !f.fresh || f.writers.size() != 1) return true;
  for (int r : f.readers) {
    if (removed[r]) continue;
    if (std::find(members.begin(), members.begin() + static_cast<std::ptrdiff_t>(count), r) ==
        members.begin() + static_cast<std::ptrdiff_t>(count))
      return true;
  }
  return false;
}

// The longest prefix of `members` that can be one region: every stored value has the region's full shape.
size_t valid_prefix(const std::vector<int>& members, const std::vector<OpCall>& calls,
                    const std::vector<bool>& removed, const Facts& facts) {
  for (size_t count = members.size(); count >= 2; --count) {
    Shape g = calls[members[0]].outputs[0].shape();
    for (size_t k = 1; k < count; ++k)
      g = broadcast_shapes(g, calls[members[k]].outputs[0].shape(), "fusion");
    bool ok = true;
    bool any_stored = false;
    for (size_t k = 0; k < count && ok; ++k) {
      if (!must_store(members[k], members, count, calls, removed, facts)) continue;
      any_stored = true;
      ok = calls[members[k]].outputs[0].shape() == g;
    }
    if (ok && any_stored) return count;
  }
  return members.size() >= 1 ? 1 : 0;
}

std::shared_ptr<FusedGroup> build_group(const std::vector<int>& members, const std::vector<OpCall>& calls,
                                        const std::vector<bool>& removed, const Facts& facts) {
  Shape g = calls[members[0]].outputs[0].shape();
  for (int m : members) g = broadcast_shapes(g, calls[m].outputs[0].shape(), "fusion");
  auto group = std::make_shared<FusedGroup>();
  group->region = ElementwiseRegion(g);
  std::unordered_map<const Storage*, ValueId> values;
  std::vector<std::pair<Tensor, ValueId>> memory_inputs;
  for (int m : members) {
    const OpCall& c = calls[m];
    std::vector<ValueId> args;
    for (const Tensor& t : c.inputs) {
      if (auto it = values.find(sid(t)); it != values.end()) {
        args.push_back(it->second);
        continue;
      }
      ValueId v = -1;
      for (const auto& [seen, id] : memory_inputs)
        if (same_view(seen, t)) v = id;
      if (v < 0) {
        v = group->region.input_like(t.dtype(), t.shape(), t.strides());
        memory_inputs.emplace_back(t, v);
        group->inputs.push_back(t);
      }
      args.push_back(v);
    }
    const ValueId out = add_to_region(group->region, c, args, group->scalars);
    values[sid(c.outputs[0])] = out;
    if (must_store(m, members, members.size(), calls, removed, facts)) {
      group->region.output(out, c.outputs[0].dtype());
      group->outputs.push_back(c.outputs[0]);
    }
    group->members.push_back(c);
  }
  return group;
}

// ---- device regions

// Whether the backend of `c`'s device runs it inside a region (runtime::Backend::joins_region).
bool joins_region(const OpCall& c) {
  if (c.outputs.empty() || !c.outputs.front().defined()) return false;
  return runtime::backend_for(c.outputs.front().device().type).joins_region(c);
}

// The first weight group among the tensors `c` reads (PlanOptions::weight_group_of), -1 when none.
int weight_group_read(const OpCall& c, const PlanOptions& options) {
  if (!options.weight_group_of) return -1;
  for (const Tensor& t : c.inputs)
    if (t.defined())
      if (const int g = options.weight_group_of(*t.storage()); g >= 0) return g;
  return -1;
}

// The region of `members` (in order), each output marked stored when a value of its storage is needed
// beyond the region: seen outside the graph, existing before it, or read or written by a live call outside
// it. Everything else lives only inside the region's program.
std::shared_ptr<runtime::DeviceRegion> build_region(const std::vector<int>& members,
                                                    std::vector<OpCall>& calls,
                                                    const std::vector<bool>& removed, const Facts& facts) {
  const std::unordered_set<int> inside(members.begin(), members.end());
  auto outside = [&](const std::vector<int>& users) {
    for (int u : users)
      if (!removed[u] && !inside.count(u)) return true;
    return false;
  };
  auto region = std::make_shared<runtime::DeviceRegion>();
  for (int m : members) {
    std::vector<bool> stored;
    for (const Tensor& t : calls[m].outputs) {
      if (!t.defined()) {
        stored.push_back(false);
        continue;
      }
      const StorageFacts& f = facts.at(sid(t));
      stored.push_back(f.external || !f.fresh || outside(f.readers) || outside(f.writers));
    }
    region->stored.push_back(std::move(stored));
  }
  for (int m : members) region->calls.push_back(std::move(calls[m]));
  return region;
}

}  // namespace

std::string FusedGroup::describe() const {
  std::ostringstream s;
  s << "fused[";
  for (size_t i = 0; i < members.size(); ++i) s << (i ? ", " : "") << members[i].op;
  s << "](";
  for (size_t i = 0; i < inputs.size(); ++i)
    s << (i ? ", " : "") << dtype_name(inputs[i].dtype()) << shape_str(inputs[i].shape());
  s << ") -> ";
  for (size_t i = 0; i < outputs.size(); ++i)
    s << (i ? ", " : "") << dtype_name(outputs[i].dtype()) << shape_str(outputs[i].shape());
  return s.str();
}

std::function<int(const Storage&)> current_weight_groups() {
  const MemoryPolicy& memory = current_context().memory();
  if (memory.weight_group_stats().groups == 0) return {};
  return [&memory](const Storage& s) { return memory.weight_group_of(s); };
}

std::vector<PlanStep> plan_graph(std::vector<OpCall> calls, const PlanOptions& options, PlanStats* stats) {
  PlanStats local;
  local.calls = static_cast<int64_t>(calls.size());
  {
    Facts facts = gather_facts(calls, options.keep);
    std::vector<bool> removed(calls.size(), false);
    eliminate_common(calls, removed, facts, local.common);
    calls = compact(std::move(calls), removed);
  }
  // Chains are matched after duplicates are gone (two identical linears would otherwise become two fused
  // ops), and before dead code goes, which then takes what the fused ops made unnecessary (1 + scale).
  if (options.fuse) calls = rewrite_fused_patterns(std::move(calls), options.keep, &local.patterns);
  Facts facts = gather_facts(calls, options.keep);
  std::vector<bool> removed(calls.size(), false);
  eliminate_dead(calls, removed, facts, local.dead);

  std::vector<PlanStep> plan;
  GroupBuilder group(calls, facts);
  auto emit_single = [&](int i) { plan.push_back(PlanStep{std::move(calls[i]), nullptr, nullptr}); };
  // Emits the group's longest valid prefix fused (or its first call alone), then re-offers the rest.
  std::vector<int> pending;
  auto flush_group = [&](auto& self) -> void {
    if (group.empty()) return;
    std::vector<int> members = group.members();
    group.clear();
    const size_t n = valid_prefix(members, calls, removed, facts);
    if (n >= 2) {
      std::vector<int> prefix(members.begin(), members.begin() + static_cast<std::ptrdiff_t>(n));
      auto fused = build_group(prefix, calls, removed, facts);
      local.fused_calls += static_cast<int64_t>(n);
      local.fused_kernels++;
      plan.push_back(PlanStep{OpCall{}, std::move(fused), nullptr});
    } else {
      emit_single(members[0]);
    }
    const size_t done = std::max<size_t>(n, 1);
    for (size_t k = done; k < members.size(); ++k) {
      if (!group.try_add(members[k])) {
        self(self);
        group.try_add(members[k]);
      }
    }
    self(self);  // drains what was re-offered, so nothing after the group overtakes it
  };
  // Consecutive calls on one device whose backend runs regions, reading the weights of one group at most; a
  // lone call runs as in strict eager.
  std::vector<int> region;
  int region_group = -1;
  auto flush_region = [&] {
    region_group = -1;
    if (region.size() == 1) emit_single(region.front());
    if (region.size() >= 2) {
      plan.push_back(PlanStep{OpCall{}, nullptr, build_region(region, calls, removed, facts)});
      local.region_calls += static_cast<int64_t>(region.size());
      local.regions++;
    }
    region.clear();
  };
  for (int i = 0; i < static_cast<int>(calls.size()); ++i) {
    if (removed[i]) continue;
    if (options.fuse && joins_region(calls[i])) {
      flush_group(flush_group);
      if (!region.empty() &&
          calls[region.front()].outputs.front().device() != calls[i].outputs.front().device())
        flush_region();
      const int reads = weight_group_read(calls[i], options);
      if (reads >= 0 && region_group >= 0 && reads != region_group) flush_region();
      if (reads >= 0) region_group = reads;
      region.push_back(i);
      continue;
    }
    flush_region();
    if (!options.fuse || !is_fusable(calls[i])) {
      flush_group(flush_group);
      emit_single(i);
      continue;
    }
    if (!group.try_add(i)) {
      flush_group(flush_group);
      group.try_add(i);
    }
  }
  flush_group(flush_group);
  flush_region();
  if (stats) *stats = local;
  return plan;
}

}  // namespace kiln::graph
