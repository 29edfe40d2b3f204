// What a graph pass knows about each storage that a sequence of recorded op calls touches: who writes and
// reads it, whether it was made inside the graph, and whether anything outside the graph still refers to it.
// Reference counts answer the last question, so the calls must be the only copies the pass holds.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "runtime/op_call.h"

namespace kiln::graph {

struct StorageFacts {
  int64_t graph_refs = 0;    // tensors in the recorded calls that refer to it
  bool external = false;     // something outside the graph refers to it too (or the caller keeps it)
  bool fresh = false;        // first touched as an output of a call, and never allocated: made in the graph
  std::vector<int> writers;  // calls writing it, in order
  std::vector<int> readers;  // calls reading it, in order
};

using Facts = std::unordered_map<const Storage*, StorageFacts>;

inline const Storage* sid(const Tensor& t) {
  return t.storage().get();
}

// `keep`: storages to treat as seen outside the graph whatever the reference counts say.
Facts gather_facts(const std::vector<runtime::OpCall>& calls, const std::vector<const Storage*>& keep);

// Whether `t` (an output of call `writer`) is made by that call alone, inside the graph, and unseen outside.
bool is_private(const Facts& facts, const Tensor& t, int writer);

// Whether `a` and `b` are the same view: storage, offset, dtype, shape and strides.
bool same_view(const Tensor& a, const Tensor& b);

// Whether any of `tensors`' storages is written by a call strictly between `from` and `to`.
bool written_between(const Facts& facts, const std::vector<Tensor>& tensors, int from, int to);

}  // namespace kiln::graph
