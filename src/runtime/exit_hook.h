// Process exit with work still queued: static destructors (oneDNN's caches and engines, JIT code, our own
// function-local statics) run while a worker thread may be inside a kernel that uses them. The exit hook
// shuts every WorkerStream down (waits for the task in flight, drops the rest, joins the worker) before
// those destructors run.
//
// Statics run their destructors in the reverse order of their construction interleaved with atexit
// handlers, and kernels create statics lazily on their first run. So the hook is armed again after each
// kernel's first run: it is then registered after every static that kernel created and runs before them.
// It is idempotent; the number of registrations is bounded by the number of distinct kernels.
#pragma once

namespace kiln::runtime {

class WorkerStream;

// Registers the exit hook (again) with std::atexit.
void arm_exit_hook();
// The streams the exit hook shuts down (WorkerStream registers itself while it exists).
void register_for_exit(WorkerStream* stream);
void unregister_for_exit(WorkerStream* stream);

}  // namespace kiln::runtime
