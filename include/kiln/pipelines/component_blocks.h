// Which repeated block (nn::Module::repeated_blocks) each weight of a pipeline folder's component belongs to,
// known from the component's config without loading it: `kiln info --max-memory` plans group offload with it.
// The model Kiln would load is built unloaded (registering parameters allocates nothing) and asked.
#pragma once

#include <map>
#include <string>

#include "kiln/io/model_summary.h"
#include "kiln/nn/block_positions.h"

namespace kiln {

// By parameter name, for the component classes a registered family knows (Family::unloaded_component); empty
// for other classes and for components without a folder. Throws kiln::Error for a config the model
// refuses, as loading it would.
std::map<std::string, nn::BlockPosition> component_block_positions(const io::ComponentSummary& component);

}  // namespace kiln
