#include "kiln/runtime/execution_context.h"

#include "kiln/core/device_runtime.h"
#include "runtime/context_state.h"

namespace kiln {

namespace runtime {

std::shared_ptr<Stream> ContextState::stream(Device device) {
  std::lock_guard lock(mutex_);
  for (const auto& [d, s] : streams_)
    if (d == device) return s;
  streams_.emplace_back(device, device_runtime(device).create_stream());
  return streams_.back().second;
}

std::shared_ptr<Stream> ContextState::existing_stream(Device device) {
  std::lock_guard lock(mutex_);
  for (const auto& [d, s] : streams_)
    if (d == device) return s;
  return nullptr;
}

std::vector<std::shared_ptr<Stream>> ContextState::streams() {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<Stream>> out;
  for (const auto& [d, s] : streams_) out.push_back(s);
  return out;
}

DeferredGraph& ContextState::deferred_graph(ExecutionContext& owner) {
  std::lock_guard lock(mutex_);
  if (!deferred_) deferred_ = make_deferred_graph(owner);
  return *deferred_;
}

std::shared_ptr<DeferredGraph> ContextState::existing_deferred_graph() {
  std::lock_guard lock(mutex_);
  return deferred_;
}

void ContextState::flush_deferred() {
  if (const std::shared_ptr<DeferredGraph> graph = existing_deferred_graph()) graph->flush();
}

}  // namespace runtime

namespace {
thread_local ExecutionContext* t_current = nullptr;
}  // namespace

ExecutionContext::ExecutionContext(std::string name)
    : state_(std::make_unique<runtime::ContextState>(std::move(name))) {}

std::shared_ptr<ExecutionContext> ExecutionContext::create(std::string name) {
  return std::shared_ptr<ExecutionContext>(new ExecutionContext(std::move(name)));
}

ExecutionContext& ExecutionContext::default_context() {
  // Never destroyed: kernels and late destructors may reach it during exit; its streams are stopped by the
  // exit hook (runtime/exit_hook.h).
  static ExecutionContext* context = new ExecutionContext("default");
  return *context;
}

ExecutionContext::~ExecutionContext() {
  // What it recorded still runs (someone may hold its results), and nothing of its work may outlive it: its
  // tasks refer to it. Failures nobody asked about go with it.
  try {
    ExecutionScope in(*this);
    state_->flush_deferred();
  } catch (...) {
  }
  for (const auto& stream : state_->streams()) stream->drain();
}

const std::string& ExecutionContext::name() const {
  return state_->name;
}

void ExecutionContext::set_eager_mode(std::optional<EagerMode> mode) {
  state_->mode.store(mode ? static_cast<int>(*mode) : -1);
}

std::optional<EagerMode> ExecutionContext::eager_mode_setting() const {
  const int m = state_->mode.load(std::memory_order_relaxed);
  return m < 0 ? std::nullopt : std::optional<EagerMode>(static_cast<EagerMode>(m));
}

MemoryPolicy& ExecutionContext::memory() {
  return state_->memory;
}

const MemoryPolicy& ExecutionContext::memory() const {
  return state_->memory;
}

void ExecutionContext::synchronize(Device device) {
  // Ops recorded in DeferAndFuse mode run first: whoever synchronises wants their results.
  {
    ExecutionScope in(*this);
    state_->flush_deferred();
  }
  if (const std::shared_ptr<Stream> stream = state_->existing_stream(device)) stream->synchronize();
}

void ExecutionContext::synchronize_all() {
  {
    ExecutionScope in(*this);
    state_->flush_deferred();
  }
  for (const auto& stream : state_->streams()) stream->synchronize();
}

runtime::ContextState& ExecutionContext::state() {
  return *state_;
}

ExecutionScope::ExecutionScope(ExecutionContext& context) : previous_(t_current) {
  t_current = &context;
}

ExecutionScope::~ExecutionScope() {
  t_current = previous_;
}

ExecutionContext& current_context() {
  return t_current != nullptr ? *t_current : ExecutionContext::default_context();
}

void synchronize(Device device) {
  current_context().synchronize(device);
}

}  // namespace kiln
