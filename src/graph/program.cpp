#include "graph/program.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "graph/fused_launch.h"
#include "graph/graph_facts.h"
#include "graph/graph_plan.h"
#include "graph/region_launch.h"
#include "runtime/capture.h"
#include "runtime/dispatcher.h"

namespace kiln::graph {

namespace {

constexpr size_t kArenaAlign = 64;

// One step before tensors are turned into references: a call, or a fused group with its kernel.
struct Item {
  runtime::OpCall call;
  std::shared_ptr<FusedGroup> group;
  std::shared_ptr<const FusedKernel> kernel;
  std::shared_ptr<runtime::DeviceRegion> region;
};

// Flattens the plan, building each fused group's kernel now (a group without one runs as its calls).
std::vector<Item> build_items(std::vector<PlanStep> plan) {
  std::vector<Item> items;
  for (PlanStep& step : plan) {
    if (step.region) {
      items.push_back(Item{runtime::OpCall{}, nullptr, nullptr, std::move(step.region)});
      continue;
    }
    if (!step.fused) {
      items.push_back(Item{std::move(step.call), nullptr, nullptr, nullptr});
      continue;
    }
    auto kernel = CpuJit::global().kernel(step.fused->region);
    if (kernel) {
      items.push_back(Item{runtime::OpCall{}, step.fused, kernel, nullptr});
    } else {
      for (runtime::OpCall& c : step.fused->members)
        items.push_back(Item{std::move(c), nullptr, nullptr, nullptr});
    }
  }
  return items;
}

// Greedy first fit by size: each buffer takes the lowest offset not overlapping a buffer alive at the same
// time. Returns the arena size.
int64_t place_in_order(std::vector<int64_t>& offsets, const std::vector<size_t>& bytes,
                       const std::vector<int>& first, const std::vector<int>& last,
                       const std::vector<int>& order) {
  std::vector<int> placed;
  int64_t total = 0;
  for (int b : order) {
    const int64_t size = static_cast<int64_t>((bytes[b] + kArenaAlign - 1) / kArenaAlign * kArenaAlign);
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (int p : placed)
      if (!(last[p] < first[b] || last[b] < first[p]))
        busy.emplace_back(offsets[p], offsets[p] + static_cast<int64_t>((bytes[p] + kArenaAlign - 1) /
                                                                        kArenaAlign * kArenaAlign));
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& [begin, end] : busy) {
      if (at + size <= begin) break;
      at = std::max(at, end);
    }
    offsets[b] = at;
    total = std::max(total, at + size);
    placed.push_back(b);
  }
  return total;
}

// Places every arena buffer at a fixed offset so that buffers alive at the same time never overlap. Two
// greedy first-fit orders are tried (largest first; first used first) and the smaller arena kept.
int64_t plan_arena(std::vector<int64_t>& offsets, const std::vector<size_t>& bytes,
                   const std::vector<int>& first, const std::vector<int>& last,
                   const std::vector<bool>& in_arena) {
  std::vector<int> order;
  for (size_t b = 0; b < bytes.size(); ++b)
    if (in_arena[b]) order.push_back(static_cast<int>(b));
  std::vector<int> by_size = order, by_start = order;
  std::stable_sort(by_size.begin(), by_size.end(), [&](int a, int b) { return bytes[a] > bytes[b]; });
  std::stable_sort(by_start.begin(), by_start.end(), [&](int a, int b) {
    return first[a] != first[b] ? first[a] < first[b] : bytes[a] > bytes[b];
  });
  std::vector<int64_t> size_offsets = offsets, start_offsets = offsets;
  const int64_t size_total = place_in_order(size_offsets, bytes, first, last, by_size);
  const int64_t start_total = place_in_order(start_offsets, bytes, first, last, by_start);
  offsets = size_total <= start_total ? size_offsets : start_offsets;
  return std::min(size_total, start_total);
}

// The most bytes alive at once: what any placement needs at least.
int64_t peak_live(const std::vector<size_t>& bytes, const std::vector<int>& first,
                  const std::vector<int>& last, const std::vector<bool>& in_arena, int steps) {
  std::vector<int64_t> delta(static_cast<size_t>(steps) + 1, 0);
  for (size_t b = 0; b < bytes.size(); ++b) {
    if (!in_arena[b] || last[b] < 0) continue;
    delta[static_cast<size_t>(first[b])] += static_cast<int64_t>(bytes[b]);
    delta[static_cast<size_t>(last[b]) + 1] -= static_cast<int64_t>(bytes[b]);
  }
  int64_t live = 0, peak = 0;
  for (int64_t d : delta) peak = std::max(peak, live += d);
  return peak;
}

}  // namespace

std::shared_ptr<Program> Program::trace(const std::vector<Tensor>& inputs, const std::vector<Tensor>& params,
                                        const Forward& forward) {
  for (const Tensor& t : inputs)
    KILN_CHECK(!t.defined() || t.is_contiguous(), "compile: internal: traced inputs must be contiguous");
  std::vector<runtime::OpCall> captured;
  std::vector<Tensor> outputs;
  {
    runtime::CaptureGuard capture(&captured);
    outputs = forward(inputs);
  }
  auto program = std::shared_ptr<Program>(new Program());
  Program& p = *program;
  p.stats_.traced_calls = static_cast<int64_t>(captured.size());
  for (const Tensor& t : inputs) p.input_shapes_.push_back(t.defined() ? t.shape() : Shape{-1});
  for (const Tensor& t : params) p.param_shapes_.push_back(t.defined() ? t.shape() : Shape{-1});

  PlanOptions options;
  options.weight_group_of = current_weight_groups();
  for (const Tensor& t : outputs) {
    KILN_CHECK(t.defined(), "compile: the traced forward returned an undefined tensor");
    options.keep.push_back(sid(t));
  }
  PlanStats plan_stats;
  std::vector<Item> items = build_items(plan_graph(std::move(captured), options, &plan_stats));
  p.stats_.chains_fused = plan_stats.patterns;

  // Roles of the storages the steps touch.
  std::unordered_map<const Storage*, int> input_of;
  for (size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].defined()) input_of.emplace(sid(inputs[k]), static_cast<int>(k));
  std::unordered_map<const Storage*, std::vector<int>> params_of;
  for (size_t k = 0; k < params.size(); ++k)
    if (params[k].defined()) params_of[sid(params[k])].push_back(static_cast<int>(k));
  std::unordered_set<const Storage*> produced;
  for (const Item& it : items) {
    if (it.region) {
      for (const runtime::OpCall& c : it.region->calls)
        for (const Tensor& t : c.outputs)
          if (t.defined()) produced.insert(sid(t));
      continue;
    }
    for (const Tensor& t : it.group ? it.group->outputs : it.call.outputs)
      if (t.defined()) produced.insert(sid(t));
  }

  std::unordered_map<const Storage*, int> buffer_of;
  std::unordered_map<const Storage*, int> constant_of;
  std::vector<size_t> bytes;
  std::vector<Device> buffer_devices;
  auto ref = [&](const Tensor& t) {
    ValueRef r;
    if (!t.defined()) return r;
    r.shape = t.shape();
    r.strides = t.strides();
    r.dtype = t.dtype();
    const Storage* s = sid(t);
    if (auto it = input_of.find(s); it != input_of.end()) {
      r.kind = ValueRef::Kind::Input;
      r.index = it->second;
      r.offset = t.offset() - inputs[it->second].offset();
      return r;
    }
    if (auto it = params_of.find(s); it != params_of.end()) {
      for (int k : it->second) {
        const Tensor& prm = params[k];
        if (t.offset() >= prm.offset() && t.offset() < prm.offset() + std::max<int64_t>(prm.numel(), 1)) {
          r.kind = ValueRef::Kind::Param;
          r.index = k;
          r.offset = t.offset() - prm.offset();
          return r;
        }
      }
    }
    if (produced.count(s)) {
      auto [it, inserted] = buffer_of.try_emplace(s, static_cast<int>(bytes.size()));
      if (inserted) {
        bytes.push_back(s->bytes());
        buffer_devices.push_back(s->device());
      }
      r.kind = ValueRef::Kind::Buffer;
      r.index = it->second;
      r.offset = t.offset();
      return r;
    }
    // Read but neither an input, a parameter nor made by the forward: a constant (say a table the forward
    // built on the host from shapes), kept as it is.
    r.kind = ValueRef::Kind::Constant;
    r.index = static_cast<int>(p.constants_.size());
    p.constants_.push_back(t);
    return r;
  };

  for (Item& it : items) {
    ProgramStep step;
    if (it.region) {
      for (const runtime::OpCall& c : it.region->calls) {
        RegionCallRef call{c.op, c.attrs, c.may_merge, {}, {}};
        for (const Tensor& t : c.inputs) call.inputs.push_back(ref(t));
        for (const Tensor& t : c.outputs) call.outputs.push_back(ref(t));
        step.region_calls.push_back(std::move(call));
      }
      step.region_stored = it.region->stored;
      step.description = it.region->describe();
      p.stats_.regions++;
    } else if (it.group) {
      step.kernel = it.kernel;
      step.region = std::make_shared<const ElementwiseRegion>(it.group->region);
      step.scalars = it.group->scalars;
      step.description = it.group->describe();
      for (const Tensor& t : it.group->inputs) step.inputs.push_back(ref(t));
      for (const Tensor& t : it.group->outputs) step.outputs.push_back(ref(t));
      p.stats_.fused_kernels++;
    } else {
      step.op = it.call.op;
      step.attrs = it.call.attrs;
      step.description = it.call.describe();
      for (const Tensor& t : it.call.inputs) step.inputs.push_back(ref(t));
      for (const Tensor& t : it.call.outputs) step.outputs.push_back(ref(t));
    }
    p.steps_.push_back(std::move(step));
  }
  for (const Tensor& t : outputs) p.outputs_.push_back(ref(t));
  p.stats_.steps = static_cast<int64_t>(p.steps_.size());

  // Liveness of each buffer in steps; outputs live beyond the run and get their own memory.
  const int n = static_cast<int>(bytes.size());
  std::vector<int> first(static_cast<size_t>(n), 1 << 30), last(static_cast<size_t>(n), -1);
  for (int i = 0; i < static_cast<int>(p.steps_.size()); ++i)
    for (const auto* refs : {&p.steps_[i].inputs, &p.steps_[i].outputs})
      for (const ValueRef& r : *refs)
        if (r.kind == ValueRef::Kind::Buffer) {
          first[r.index] = std::min(first[r.index], i);
          last[r.index] = std::max(last[r.index], i);
        }
  // The arena is host memory: a storage on another device is its own (and, unless a region stores it, never
  // gets memory at all).
  std::vector<bool> in_arena(static_cast<size_t>(n), true);
  for (int b = 0; b < n; ++b)
    if (buffer_devices[static_cast<size_t>(b)].type != DeviceType::CPU)
      in_arena[static_cast<size_t>(b)] = false;
  for (const ValueRef& r : p.outputs_)
    if (r.kind == ValueRef::Kind::Buffer) in_arena[r.index] = false;
  std::vector<int64_t> offsets(static_cast<size_t>(n), -1);
  p.stats_.arena_bytes = plan_arena(offsets, bytes, first, last, in_arena);
  p.stats_.peak_live_bytes = peak_live(bytes, first, last, in_arena, static_cast<int>(p.steps_.size()));
  for (int b = 0; b < n; ++b) {
    p.buffers_.push_back(Buffer{bytes[b], in_arena[b] ? offsets[b] : -1, buffer_devices[b]});
    if (in_arena[b]) p.stats_.unplanned_bytes += static_cast<int64_t>(bytes[b]);
  }
  return program;
}

std::vector<Tensor> Program::run(const std::vector<Tensor>& inputs, const std::vector<Tensor>& params) const {
  KILN_CHECK(inputs.size() == input_shapes_.size() && params.size() == param_shapes_.size(),
             "compiled forward: expected " << input_shapes_.size() << " inputs and " << param_shapes_.size()
                                           << " parameters, got " << inputs.size() << " and "
                                           << params.size());
  const std::shared_ptr<Storage> arena =
      stats_.arena_bytes > 0 ? Storage::allocate(static_cast<size_t>(stats_.arena_bytes), cpu) : nullptr;
  std::vector<std::shared_ptr<Storage>> own(buffers_.size());
  auto bind = [&](const ValueRef& r) -> Tensor {
    switch (r.kind) {
      case ValueRef::Kind::Undefined:
        return Tensor();
      case ValueRef::Kind::Input: {
        const Tensor& t = inputs[static_cast<size_t>(r.index)];
        return Tensor(t.storage(), r.shape, r.strides, t.offset() + r.offset, r.dtype);
      }
      case ValueRef::Kind::Param: {
        const Tensor& t = params[static_cast<size_t>(r.index)];
        return Tensor(t.storage(), r.shape, r.strides, t.offset() + r.offset, r.dtype);
      }
      case ValueRef::Kind::Constant:
        return constants_[static_cast<size_t>(r.index)];
      case ValueRef::Kind::Buffer: {
        const Buffer& b = buffers_[static_cast<size_t>(r.index)];
        if (b.arena_offset >= 0)
          return Tensor(arena, r.shape, r.strides,
                        b.arena_offset / static_cast<int64_t>(dtype_size(r.dtype)) + r.offset, r.dtype);
        auto& s = own[static_cast<size_t>(r.index)];
        if (!s) s = Storage::allocate(b.bytes, b.device);
        return Tensor(s, r.shape, r.strides, r.offset, r.dtype);
      }
    }
    return Tensor();
  };
  for (const ProgramStep& step : steps_) {
    if (!step.region_calls.empty()) {
      auto region = std::make_shared<runtime::DeviceRegion>();
      for (const RegionCallRef& c : step.region_calls) {
        runtime::OpCall call{c.op, {}, {}, c.attrs, c.may_merge};
        for (const ValueRef& r : c.inputs) call.inputs.push_back(bind(r));
        for (const ValueRef& r : c.outputs) call.outputs.push_back(bind(r));
        region->calls.push_back(std::move(call));
      }
      region->stored = step.region_stored;
      launch_region(std::move(region));
      continue;
    }
    std::vector<Tensor> ins, outs;
    ins.reserve(step.inputs.size());
    outs.reserve(step.outputs.size());
    for (const ValueRef& r : step.inputs) ins.push_back(bind(r));
    for (const ValueRef& r : step.outputs) outs.push_back(bind(r));
    if (!step.kernel) {
      runtime::launch(runtime::OpCall{step.op, std::move(ins), std::move(outs), step.attrs});
      continue;
    }
    launch_fused(step.kernel, step.region, step.scalars, std::move(ins), std::move(outs),
                 [description = step.description] { return description; });
  }
  std::vector<Tensor> result;
  for (const ValueRef& r : outputs_) result.push_back(bind(r));
  return result;
}

}  // namespace kiln::graph
