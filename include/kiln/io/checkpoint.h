// A model's weights: one .safetensors file, or a sharded set described by a *.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor name: shard file}}), read through one name lookup.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/io/safetensors.h"

namespace kiln::io {

class Checkpoint {
 public:
  // Opens `path`: a .safetensors file or an index .json. Every shard is opened and validated up front:
  // throws kiln::Error naming the index and the shard when a shard is missing or corrupt, a name in the
  // weight_map is absent from its shard, or two shards hold the same name.
  explicit Checkpoint(const std::string& path);

  const std::string& path() const { return path_; }
  bool sharded() const { return sharded_; }
  // Shard files in the order the weight_map first names them (one entry when not sharded).
  const std::vector<std::shared_ptr<SafetensorsFile>>& shards() const { return shards_; }
  // Tensor names, sorted.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const { return file_of(name).info(name); }
  // The shard holding `name`; throws naming the checkpoint when there is no such tensor.
  const SafetensorsFile& file_of(const std::string& name) const;

  Tensor tensor(const std::string& name) const { return file_of(name).tensor(name); }
  Tensor rows(const std::string& name, int64_t start, int64_t end) const {
    return file_of(name).rows(name, start, end);
  }
  Tensor columns(const std::string& name, int64_t start, int64_t end) const {
    return file_of(name).columns(name, start, end);
  }
  Tensor stored_bytes(const std::string& name) const { return file_of(name).stored_bytes(name); }

  // The index's "metadata" (e.g. total_size) as text, or the single file's __metadata__.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Sum of the shard file sizes.
  uint64_t bytes_on_disk() const;

 private:
  std::string path_;
  bool sharded_ = false;
  std::vector<std::shared_ptr<SafetensorsFile>> shards_;
  std::vector<std::string> names_;
  std::map<std::string, const SafetensorsFile*> where_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a component folder (e.g. "transformer/"), as the libraries name them:
//   diffusion_pytorch_model.safetensors (diffusers) or model.safetensors (transformers), or their sharded
//   index, diffusion_pytorch_model.safetensors.index.json / model.safetensors.index.json (the index wins
//   when both exist, as in diffusers).
// With a `variant` ("fp16", "bf16"), only the variant files: diffusion_pytorch_model.fp16.safetensors,
// diffusion_pytorch_model.safetensors.index.fp16.json (and the older ...fp16.safetensors.index.json).
// Throws kiln::Error naming the folder, what was looked for and what is there (e.g. only .bin files).
std::string find_checkpoint(const std::string& component_dir, const std::string& variant = "");
// Same, but returns "" when the folder holds no weights at all (a scheduler or tokenizer folder).
std::string find_checkpoint_if_any(const std::string& component_dir, const std::string& variant = "");

}  // namespace kiln::io
