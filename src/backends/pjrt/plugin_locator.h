// Where a PJRT plugin is found for a device kind. In order, the first existing file wins:
//   1. $KILN_PJRT_PLUGIN: a plugin's path, used for any kind (an error when it does not exist);
//   2. $KILN_PJRT_PLUGIN_DIR/<the kind's file name> (pjrt_c_api_cpu_plugin.so, xla_cuda_plugin.so,
//   libtpu.so);
//   3. xla-cpu only: the CPU plugin scripts/fetch_pjrt.sh installs, <Kiln's
//   cache>/pjrt/lib/pjrt_c_api_cpu_plugin.so;
//   4. the kind's file in a pip package, in Python's package folders:
//   $VIRTUAL_ENV/lib/python3*/site-packages,
//      each $PYTHONPATH entry, ~/.local/lib/python3*/site-packages, /usr/local/lib/python3*/dist-packages,
//      /usr/lib/python3/dist-packages:
//        xla-cpu  lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so (pip: lammps-jax-pjrt-cpu)
//        cuda     jax_plugins/xla_cuda13/xla_cuda_plugin.so, then xla_cuda12 (pip: jax-cuda13-pjrt,
//        jax-cuda12-pjrt) tpu      libtpu/libtpu.so (pip: libtpu; its licence forbids shipping it, so Kiln
//        only finds it)
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln::pjrt {

// The plugin for "xla-cpu", "cuda" or "tpu". Throws a kiln::Error listing every place looked in and the
// install command when none is found, or naming the known kinds for any other kind.
std::string find_plugin(std::string_view device_kind);

// The candidate paths find_plugin checks for `device_kind` after $KILN_PJRT_PLUGIN, in order (whether they
// exist or not).
std::vector<std::string> plugin_candidates(std::string_view device_kind);

// The first of `paths` that is a regular file; empty when none is.
std::string first_existing_file(const std::vector<std::string>& paths);

}  // namespace kiln::pjrt
