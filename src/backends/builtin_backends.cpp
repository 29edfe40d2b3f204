// The backends built into this library, registered with the runtime (runtime/backend.h): the runtime and the
// graph include no backend, so a new one is added here and nowhere else in them.
#include "backends/cpu/cpu_runtime.h"
#include "backends/pjrt/pjrt_backend.h"
#include "runtime/backend.h"

namespace kiln::runtime {

void register_builtin_backends(std::vector<Backend*>& into) {
  into.push_back(&cpu_backend());
  into.push_back(&pjrt::pjrt_backend());
}

}  // namespace kiln::runtime
