#include "kiln/pipelines/component_blocks.h"

#include <memory>

#include "kiln/nn/module.h"
#include "kiln/pipelines/pipeline_registry.h"

namespace kiln {

std::map<std::string, nn::BlockPosition> component_block_positions(const io::ComponentSummary& component) {
  if (component.path.empty()) return {};
  // The family that knows the component's class builds its model, unloaded.
  for (const Family& family : families()) {
    if (!family.unloaded_component) continue;
    if (const std::unique_ptr<nn::Module> model = family.unloaded_component(component.class_name, component.path))
      return nn::block_positions_by_name(*model);
  }
  return {};
}

}  // namespace kiln
