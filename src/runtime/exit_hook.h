// Process exit, thread exit and fork with work queued on a WorkerStream.
//
// Exit. Static destructors (oneDNN's engine and primitive caches, the JIT's kernel cache, our own
// function-local statics) run in the reverse order of their construction, interleaved with std::atexit
// handlers, and kernels create many of them lazily on their first run, on the worker. So an atexit handler
// registered at any one time runs AFTER the statics created later, while the worker may still be inside a
// kernel that uses them: the reverted first version (4d04284) crashed or spun there when exit() came
// while the first linear kernels were still creating oneDNN's statics (re-arming the handler after each
// kernel's first run cannot close that window: the handler is re-registered only once the kernel has
// finished, and statics created on the host thread are not covered at all).
//
// glibc's exit() runs the calling thread's thread_local destructors before every atexit handler and static
// destructor. Every thread that queues work therefore gets a thread_local sentinel whose destructor:
//   - on the main thread (return from main, or exit() there): shuts every stream down, i.e. stops taking
//     tasks, waits for the task in flight, drops the queued ones and joins the worker, while every static
//     is still alive;
//   - on another thread (its end, or exit() called there): waits for the work queued so far to finish,
//     so that a process exit from that thread finds the worker idle before any static goes.
// A std::atexit hook, registered when a worker starts, is the last resort for exit() from a thread that
// never queued work: it waits for the running task and then leaves the worker parked (never woken, never
// joined, its dropped tasks kept), so that it touches nothing that may be destroyed by then.
//
// Fork. The child has no worker thread. fork() (pthread_atfork) waits for the queued work first, so the
// child starts with an idle stream and the results; in the child the worker's handle is forgotten and a
// new worker starts at the next op. A fork from inside a kernel leaves the child's stream failed.
#pragma once

namespace kiln::runtime {

class WorkerStream;

// Registers the last-resort exit hook with std::atexit (once per call; call it when a worker starts).
void arm_exit_hook();
// Gives the calling thread its exit sentinel (cheap after the first call on a thread).
void watch_thread_exit();
// The streams the exit and fork handling covers (WorkerStream registers itself while it exists).
void register_for_exit(WorkerStream* stream);
void unregister_for_exit(WorkerStream* stream);

}  // namespace kiln::runtime
