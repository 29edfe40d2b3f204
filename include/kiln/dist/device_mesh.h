// DeviceMesh and TensorParallelConfig with diffusers' (torch's) names, for one mesh dimension: the ranks of
// the process group laid out as "tp". A model built with a TensorParallelConfig splits its Linear layers
// over the mesh by its tensor-parallel plan and every rank reads only its slices of the weights.
//
//   kiln::dist::init_process_group({.backend = "mpi"});
//   kiln::dist::DeviceMesh mesh("cpu", {kiln::dist::world_size()});
//   auto pipe = kiln::FluxPipeline::from_pretrained(model, {.tensor_parallel = {.mesh = mesh}});
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/nn/tensor_parallel.h"

namespace kiln::dist {

class DeviceMesh {
 public:
  // `device_type`: "cpu", "xla-cpu", "cuda" or "tpu" (a type, no index). `shape`: one dimension whose size is
  // the world size (every rank takes part): the MPI process group's, or on a rank of run_local_ranks
  // (local_ranks.h) its in-process group's. Throws kiln::Error naming what differs.
  DeviceMesh(std::string device_type, std::vector<int64_t> shape);

  const std::string& device_type() const { return device_type_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t size() const { return shape_.front(); }
  // This process's coordinate along the mesh.
  int64_t local_rank() const { return local_rank_; }

 private:
  std::string device_type_;
  std::vector<int64_t> shape_;
  int64_t local_rank_ = 0;
};

// What from_pretrained takes per component (diffusers' TensorParallelConfig(mesh=...)). Without a mesh the
// component is replicated (loaded whole on every rank).
struct TensorParallelConfig {
  std::optional<DeviceMesh> mesh;

  bool enabled() const { return mesh.has_value() && mesh->size() > 1; }
  // The layer-level view the models take: this rank's index and the number of shards.
  nn::TensorParallel layers() const;
};

}  // namespace kiln::dist
