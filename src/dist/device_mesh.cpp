#include "kiln/dist/device_mesh.h"

#include "kiln/core/error.h"
#include "kiln/dist/process_group.h"

namespace kiln::dist {

DeviceMesh::DeviceMesh(std::string device_type, std::vector<int64_t> shape)
    : device_type_(std::move(device_type)), shape_(std::move(shape)) {
  KILN_CHECK(device_type_ == "cpu",
             "DeviceMesh: device type '" << device_type_ << "' has no backend; Kiln's devices are \"cpu\"");
  KILN_CHECK(shape_.size() == 1, "DeviceMesh: a mesh of "
                                     << shape_.size()
                                     << " dimensions was given; tensor parallelism uses one");
  KILN_CHECK(shape_[0] == world_size(),
             "DeviceMesh: a mesh of "
                 << shape_[0] << " devices needs " << shape_[0] << " processes, but the process group has "
                 << world_size() << (is_initialized() ? "" : " (init_process_group was not called)")
                 << "; start one process per device with `mpirun -np " << shape_[0] << "` or `kiln launch -n "
                 << shape_[0] << "`");
  local_rank_ = rank();
}

nn::TensorParallel TensorParallelConfig::layers() const {
  if (!mesh) return {};
  return nn::TensorParallel{mesh->local_rank(), mesh->size()};
}

}  // namespace kiln::dist
