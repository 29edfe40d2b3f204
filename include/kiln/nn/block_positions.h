// Which of a module's repeated blocks (Module::repeated_blocks) each of its parameters belongs to: the block
// whose module registered the parameter's slot, found by identity, so it holds however parameters are named.
// Group offload and its planner read blocks from here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/nn/module.h"

namespace kiln::nn {

struct BlockPosition {
  std::string list;    // the BlockList's name ("transformer_blocks"); empty outside every repeated block
  int64_t block = -1;  // the block's index in that list
  bool in_block() const { return block >= 0; }
  bool operator==(const BlockPosition&) const = default;
};

// One position per entry of module.named_parameters(), in that order.
std::vector<BlockPosition> parameter_block_positions(Module& module);
// The same by full parameter name.
std::map<std::string, BlockPosition> block_positions_by_name(Module& module);

}  // namespace kiln::nn
