#include "kiln/nn/block_positions.h"

#include <unordered_map>

namespace kiln::nn {

std::vector<BlockPosition> parameter_block_positions(Module& module) {
  std::unordered_map<const Tensor*, BlockPosition> owner;
  for (const BlockList& list : module.repeated_blocks())
    for (size_t i = 0; i < list.blocks.size(); ++i)
      for (const auto& [name, slot] : list.blocks[i]->named_parameters())
        owner[slot] = BlockPosition{list.name, static_cast<int64_t>(i)};
  std::vector<BlockPosition> out;
  for (const auto& [name, slot] : module.named_parameters()) {
    const auto it = owner.find(slot);
    out.push_back(it == owner.end() ? BlockPosition{} : it->second);
  }
  return out;
}

std::map<std::string, BlockPosition> block_positions_by_name(Module& module) {
  const std::vector<BlockPosition> positions = parameter_block_positions(module);
  std::map<std::string, BlockPosition> out;
  size_t i = 0;
  for (const auto& [name, slot] : module.named_parameters()) out.emplace(name, positions[i++]);
  return out;
}

}  // namespace kiln::nn
