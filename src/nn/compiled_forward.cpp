#include "nn/compiled_forward.h"

#include "kiln/core/bytes.h"
#include "kiln/core/error.h"
#include "kiln/core/log.h"
#include "kiln/runtime/execution_context.h"
#include "kiln/runtime/memory_policy.h"
#include "runtime/counter_updates.h"
#include "runtime/deferred.h"

namespace kiln::nn {

namespace {

void append_signature(std::string& key, const Tensor& t) {
  if (!t.defined()) {
    key += "none;";
    return;
  }
  key += dtype_name(t.dtype());
  key += shape_str(t.shape());
  // The device too: a program traced on one device binds its intermediates there.
  key += '@' + t.device().str();
  key += ';';
}

std::string describe_inputs(const std::vector<Tensor>& inputs) {
  std::string s;
  for (const Tensor& t : inputs) {
    if (!s.empty()) s += ", ";
    s += t.defined() ? std::string(dtype_name(t.dtype())) + shape_str(t.shape()) : "None";
  }
  return s;
}

}  // namespace

CompiledForward::CompiledForward(CompileOptions options, std::string name)
    : options_(options), name_(std::move(name)) {
  KILN_CHECK(!options_.dynamic,
             name_ << ".compile: dynamic = true (shape-polymorphic programs) is not supported; "
                      "use dynamic = false: each new input shape compiles once and is reused");
}

size_t CompiledForward::program_count() const {
  std::lock_guard lock(mutex_);
  return programs_.size();
}

std::vector<Tensor> CompiledForward::call(const std::vector<Tensor>& raw_inputs,
                                          const std::vector<Tensor>& params,
                                          const graph::Program::Forward& eager,
                                          const std::string& extra_key) {
  // Ops recorded in DeferAndFuse mode may still be making the inputs: they run first.
  runtime::flush_deferred();
  std::vector<Tensor> inputs;
  inputs.reserve(raw_inputs.size());
  for (const Tensor& t : raw_inputs) inputs.push_back(t.defined() ? t.contiguous() : t);
  std::string key = extra_key + "|";
  for (const Tensor& t : inputs) append_signature(key, t);
  key += "|";
  for (const Tensor& t : params) append_signature(key, t);
  // Device regions follow group offload's groups as they were when traced (graph/graph_plan.h): a program
  // traced before the groups changed would hold every group's weights at once.
  key += "|groups " + std::to_string(current_context().memory().weight_groups_generation());

  std::shared_ptr<graph::Program> program;
  {
    std::lock_guard lock(mutex_);
    if (eager_keys_.count(key)) return eager(inputs);
    if (auto it = programs_.find(key); it != programs_.end()) program = it->second;
  }
  if (program) {
    runtime::count_graph_cache_hit();
    return program->run(inputs, params);
  }
  try {
    program = graph::Program::trace(inputs, params, eager);
  } catch (const Error& e) {
    if (options_.fullgraph) throw Error(name_ + ".compile(fullgraph = true): " + e.what());
    warn(name_ + ".compile(fullgraph = false): the forward breaks the graph for inputs " +
         describe_inputs(inputs) + " and runs eagerly for them: " + e.what());
    std::lock_guard lock(mutex_);
    eager_keys_.insert(key);
    return eager(inputs);
  }
  runtime::count_graph_compiled();
  size_t cached = 0;
  {
    std::lock_guard lock(mutex_);
    programs_[key] = program;
    cached = programs_.size();
  }
  if (log_enabled("compile")) {
    const graph::ProgramStats& s = program->stats();
    log("compile", "compiled " + name_ + " for inputs (" + describe_inputs(inputs) + "): " +
                       (cached == 1 ? std::string("first call")
                                    : "new input shapes (" + std::to_string(cached) + " programs cached)") +
                       "; " + std::to_string(s.traced_calls) + " op calls -> " + std::to_string(s.steps) +
                       " kernels (" + std::to_string(s.fused_kernels) + " fused elementwise, " +
                       std::to_string(s.chains_fused) + " fused chains, " + std::to_string(s.regions) +
                       " device regions), arena " + format_bytes(s.arena_bytes) + " (at most " +
                       format_bytes(s.peak_live_bytes) + " alive at once) for " +
                       format_bytes(s.unplanned_bytes) + " of intermediates");
  }
  return program->run(inputs, params);
}

}  // namespace kiln::nn
