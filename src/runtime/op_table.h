// Every op Kiln has, once: its name and what the graph passes may do with it. Backends register kernels by
// these names (KernelRegistry::add refuses a name not here, so a typo cannot add an op no front end calls),
// and a new backend walks this table to map each op exactly once.
#pragma once

#include <string_view>
#include <vector>

namespace kiln::runtime {

struct OpInfo {
  std::string_view name;
  // False for ops with effects beyond their outputs (collectives: every rank must make each call): the graph
  // passes never merge two identical calls of them.
  bool may_merge = true;
};

// Kiln's ops, then any added by add_op, in order.
std::vector<OpInfo> op_table();
// The entry named `name`, or nullptr.
const OpInfo* find_op(std::string_view name);
// Adds an op of the caller's own (a test's, an embedding application's) so that kernels can be registered for
// it; `op.name` must outlive the process (a string literal). Throws kiln::Error when the name is taken.
void add_op(OpInfo op);

}  // namespace kiln::runtime
