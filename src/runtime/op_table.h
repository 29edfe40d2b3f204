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

const std::vector<OpInfo>& op_table();
// The entry named `name`, or nullptr.
const OpInfo* find_op(std::string_view name);

}  // namespace kiln::runtime
