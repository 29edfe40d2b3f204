#include "runtime/deferred.h"

#include "kiln/runtime/execution_context.h"
#include "runtime/context_state.h"

namespace kiln::runtime {

void flush_deferred() {
  current_context().state().flush_deferred();
}

size_t deferred_op_count() {
  const std::shared_ptr<DeferredGraph> graph = current_context().state().existing_deferred_graph();
  return graph ? graph->size() : 0;
}

}  // namespace kiln::runtime
