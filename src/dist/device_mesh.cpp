#include "kiln/dist/device_mesh.h"

#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/dist/process_group.h"

namespace kiln::dist {

DeviceMesh::DeviceMesh(std::string device_type, std::vector<int64_t> shape)
    : device_type_(std::move(device_type)), shape_(std::move(shape)) {
  try {
    KILN_CHECK(Device(device_type_).index == 0 && device_type_.find(':') == std::string::npos, "an index");
  } catch (const Error&) {
    KILN_FAIL(
        "DeviceMesh: '" << device_type_
                        << "' is not a device type (\"cpu\", \"xla-cpu\", \"cuda\" or \"tpu\"; no index)");
  }
  KILN_CHECK(shape_.size() == 1, "DeviceMesh: a mesh of "
                                     << shape_.size()
                                     << " dimensions was given; tensor parallelism uses one");
  KILN_CHECK(shape_[0] == world_size(),
             "DeviceMesh: a mesh of "
                 << shape_[0] << " devices needs " << shape_[0] << " processes, but the process group has "
                 << world_size() << (is_initialized() ? "" : " (init_process_group was not called)")
                 << "; start one process per device with `mpirun -np " << shape_[0] << "` or `kiln launch -n "
                 << shape_[0] << "`, or, on the devices of one PJRT client, one thread per device with "
                 << "kiln::dist::run_local_ranks");
  local_rank_ = rank();
}

nn::TensorParallel TensorParallelConfig::layers() const {
  if (!mesh) return {};
  return nn::TensorParallel{mesh->local_rank(), mesh->size()};
}

}  // namespace kiln::dist
