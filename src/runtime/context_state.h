// The runtime's side of an ExecutionContext (kiln/runtime/execution_context.h): its streams and its deferred
// graph, which the dispatcher and the deferred mode use and the public API does not show.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/stream.h"
#include "kiln/runtime/memory_policy.h"
#include "runtime/op_call.h"

namespace kiln {
class ExecutionContext;
}

namespace kiln::runtime {

// The ops a context has recorded in DeferAndFuse mode and not yet run (implemented by the graph layer,
// graph/lazy_graph.cpp, which optimises and fuses them when they are flushed). Storages its recorded ops
// write name it as their pending write, so a host read flushes it (PendingWork::wait).
class DeferredGraph : public PendingWork {
 public:
  // Records `call` (already checked by its op front end and by dispatch()).
  virtual void record(OpCall call) = 0;
  // Optimises and launches everything recorded so far, in order, on the context's streams.
  virtual void flush() = 0;
  // Ops recorded and not yet flushed.
  virtual size_t size() = 0;
};

// Made by the graph layer for each context that defers (defined in graph/lazy_graph.cpp).
std::shared_ptr<DeferredGraph> make_deferred_graph(ExecutionContext& context);

struct ContextState {
  explicit ContextState(std::string context_name) : name(std::move(context_name)) {}

  // The context's stream on `device`, made on first use.
  std::shared_ptr<Stream> stream(Device device);
  // Its stream on `device` if it has made one.
  std::shared_ptr<Stream> existing_stream(Device device);
  // Every stream it has made.
  std::vector<std::shared_ptr<Stream>> streams();
  // Its deferred graph, made on first use; flush_deferred() runs it when there is one.
  DeferredGraph& deferred_graph(ExecutionContext& owner);
  std::shared_ptr<DeferredGraph> existing_deferred_graph();
  void flush_deferred();

  const std::string name;
  std::atomic<int> mode{-1};  // -1: unset (the process default)
  MemoryPolicy memory;

 private:
  std::mutex mutex_;
  std::vector<std::pair<Device, std::shared_ptr<Stream>>> streams_;
  std::shared_ptr<DeferredGraph> deferred_;
};

}  // namespace kiln::runtime
