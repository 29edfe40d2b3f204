// An execution context owns everything that decides how ops run, so that several pipelines (or any code) in
// one process can run with different settings, and at the same time:
//   - the eager mode of the ops dispatched in it (strict eager, launch-blocking, deferred-and-fused);
//   - its deferred graph (what DeferAndFuse has recorded and not yet run);
//   - its streams, one ordered queue per device: a failure, or a synchronisation, concerns its own work only;
//   - its memory policy: the packed and resident weight budgets, prepacking, the weight groups of group
//     offload (kiln/runtime/memory_policy.h).
// Contexts share, on purpose, what is one resource or pure: the devices' allocators and their counters, the
// fused kernels the JIT builds and oneDNN's primitives (cached by what they compute, never by who asked), and
// the process group (one per process: MPI's world; kiln/dist/process_group.h).
//
// Each thread has a current context: the innermost ExecutionScope alive on it, else the process's default
// context. Ops dispatched on a thread run in its current context; a kernel runs with the context that
// dispatched it current, so whatever a kernel asks of "its" context is the dispatcher's. Pipelines hold a
// context each and enter it for every call (kiln/pipelines/diffusion_pipeline.h); code that never creates one
// runs in the default context, which behaves as Kiln always did.
//
//   auto ctx = kiln::ExecutionContext::create("my model");
//   ctx->set_eager_mode(kiln::EagerMode::DeferAndFuse);
//   ctx->memory().set_packed_weight_budget(2LL << 30);
//   {
//     kiln::ExecutionScope in(*ctx);
//     Tensor y = model.forward(x);   // recorded in ctx's graph, run on ctx's stream, under ctx's budgets
//   }
//
// Tensors may cross contexts: a storage remembers the queue that writes it last (kiln/core/pending_work.h),
// so an op of one context reading another's result waits for exactly that work first.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "kiln/core/device.h"
#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/memory_policy.h"

namespace kiln {

namespace runtime {
struct ContextState;
}

class ExecutionContext {
 public:
  // `name` appears in logs and errors ("FluxPipeline /models/flux").
  static std::shared_ptr<ExecutionContext> create(std::string name);
  // The process's context: where ops run outside any ExecutionScope. Never destroyed.
  static ExecutionContext& default_context();

  // Runs what its deferred graph still holds and waits for its streams, then goes.
  ~ExecutionContext();
  ExecutionContext(const ExecutionContext&) = delete;
  ExecutionContext& operator=(const ExecutionContext&) = delete;

  const std::string& name() const;

  // The eager mode of the ops dispatched in this context; a thread's EagerModeGuard still wins over it.
  // Unset (std::nullopt, the default): the process default (set_eager_mode, else KILN_LAUNCH_BLOCKING /
  // KILN_DEFER_AND_FUSE).
  void set_eager_mode(std::optional<EagerMode> mode);
  std::optional<EagerMode> eager_mode_setting() const;

  MemoryPolicy& memory();
  const MemoryPolicy& memory() const;

  // Runs what its deferred graph holds, then waits for the work queued on `device`; throws the first failure
  // of its ops there, naming the op, once.
  void synchronize(Device device = cpu);
  // The same for every device it has used.
  void synchronize_all();

  // ---- for the runtime
  runtime::ContextState& state();

 private:
  explicit ExecutionContext(std::string name);
  std::unique_ptr<runtime::ContextState> state_;
};

// Makes `context` the calling thread's current context while alive; scopes nest (the innermost wins).
class ExecutionScope {
 public:
  explicit ExecutionScope(ExecutionContext& context);
  ~ExecutionScope();
  ExecutionScope(const ExecutionScope&) = delete;
  ExecutionScope& operator=(const ExecutionScope&) = delete;

 private:
  ExecutionContext* previous_;
};

// The calling thread's current context.
ExecutionContext& current_context();

// current_context().synchronize(device): waits for the work this thread's context queued on `device`
// (running what its deferred graph holds first) and throws the first failure of those ops, once.
void synchronize(Device device = cpu);

}  // namespace kiln
