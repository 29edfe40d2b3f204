// The model families Kiln runs: one line each. A family is its folder (src/families/<name>/: its pipeline
// classes, the request fields each takes, its LoRA layouts, its components' models) and its line here;
// nothing else in Kiln names it (kiln/pipelines/pipeline_registry.h).
#include "families/family_helpers.h"

#define KILN_FAMILIES(X) \
  X(flux1)               \
  X(sd3)                 \
  X(flux2)               \
  X(chroma)              \
  X(z_image)             \
  X(stable_diffusion)    \
  X(qwen_image)

namespace kiln {

// Each family's descriptor, defined in its folder: src/families/<name>/family.cpp.
#define KILN_DECLARE_FAMILY(name) \
  namespace name {                \
  Family family();                \
  }
KILN_FAMILIES(KILN_DECLARE_FAMILY)
#undef KILN_DECLARE_FAMILY

std::vector<Family> registered_families() {
#define KILN_LIST_FAMILY(name) name::family(),
  return {KILN_FAMILIES(KILN_LIST_FAMILY)};
#undef KILN_LIST_FAMILY
}

}  // namespace kiln
