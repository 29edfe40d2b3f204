// Work that will write a storage but may not have yet: an op queued on a stream, or recorded in a deferred
// graph. Each Storage remembers the queue whose work writes it last (Storage::pending_write), so that reading
// its values on the host, or an op of another execution context reading it, first waits for exactly that
// work. That is what lets several execution contexts (each with its own stream and deferred graph) share
// tensors safely without one global queue.
#pragma once

namespace kiln {

class PendingWork {
 public:
  virtual ~PendingWork() = default;
  // From the host: makes the queued work run (a deferred graph is flushed) and waits until it has finished;
  // throws the queue's recorded failure (once), as a synchronisation does.
  virtual void wait() = 0;
};

// Something that wants to know about host reads of tensor values on the calling thread (compiled mode's
// tracer: while a forward is traced, the values do not exist, so a read is an error it explains).
class HostReadObserver {
 public:
  virtual ~HostReadObserver() = default;
  virtual void before_host_read(const class Tensor& t) = 0;
};

// Installs `observer` for the calling thread while alive (nests; the innermost one is asked).
class HostReadObserverScope {
 public:
  explicit HostReadObserverScope(HostReadObserver* observer);
  ~HostReadObserverScope();
  HostReadObserverScope(const HostReadObserverScope&) = delete;
  HostReadObserverScope& operator=(const HostReadObserverScope&) = delete;

 private:
  HostReadObserver* previous_;
};

// The calling thread's innermost observer, or nullptr.
HostReadObserver* host_read_observer();

}  // namespace kiln
