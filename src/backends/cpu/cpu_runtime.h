// The CPU backend (Kiln's own kernels on the host), as the runtime's registry holds it.
#pragma once

#include "runtime/backend.h"

namespace kiln {

runtime::Backend& cpu_backend();

}  // namespace kiln
