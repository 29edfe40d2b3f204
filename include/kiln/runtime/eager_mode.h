// How ops reach the kernels. Models never ask: they call ops and the dispatcher consults the mode.
//
//   DeferNever (default)      each op is enqueued on its device's stream and the call returns at once; the
//                             host waits only when it reads values or calls synchronize(), and a failing
//                             kernel surfaces there, naming the op and its shapes.
//   DeferNeverLaunchBlocking  the same, but every op waits for its kernel, so a failure surfaces at the call
//                             that caused it (for debugging; KILN_LAUNCH_BLOCKING=1).
//   DeferAndFuse              ops are only recorded into a lazy graph (KILN_DEFER_AND_FUSE=1), which is
//                             optimised, fused and run when something needs its values: a host read,
//                             synchronize(), a repeating block of ops, or a size cap (runtime/deferred.h).
//
// The mode in effect on a thread is the innermost EagerModeGuard alive on that thread, else the mode of the
// thread's execution context (ExecutionContext::set_eager_mode, kiln/runtime/execution_context.h), else the
// process mode (set_eager_mode), else the default from the environment: KILN_LAUNCH_BLOCKING=1 wins over
// KILN_DEFER_AND_FUSE=1, otherwise DeferNever.
#pragma once

#include <string_view>

namespace kiln {

enum class EagerMode { DeferNever, DeferNeverLaunchBlocking, DeferAndFuse };

std::string_view eager_mode_name(EagerMode mode);  // "DeferNever", ...

// The mode for ops dispatched by the calling thread now. Throws kiln::Error when the environment selects a
// mode that is not available or holds a value other than 0/1 (and no guard or set_eager_mode overrides it).
EagerMode eager_mode();

// Sets the process-wide mode (threads without a guard, in contexts without a mode of their own, follow it).
void set_eager_mode(EagerMode mode);

// The process default read from KILN_LAUNCH_BLOCKING / KILN_DEFER_AND_FUSE now (not cached), with the same
// errors as eager_mode(); eager_mode() uses the value read at its first call.
EagerMode eager_mode_from_environment();

// Selects `mode` for the calling thread while alive; guards nest, the innermost wins, and other threads
// are unaffected. Leaving DeferAndFuse (the guard's destructor, or set_eager_mode) does not flush: recorded
// ops run at the next synchronisation point as usual, or as soon as an op run eagerly reads their results.
class EagerModeGuard {
 public:
  explicit EagerModeGuard(EagerMode mode);
  ~EagerModeGuard();
  EagerModeGuard(const EagerModeGuard&) = delete;
  EagerModeGuard& operator=(const EagerModeGuard&) = delete;
};

}  // namespace kiln
