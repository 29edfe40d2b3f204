#include "kiln/nn/checkpoint_weights.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "kiln/io/safetensors.h"

namespace kiln::nn {

namespace fs = std::filesystem;

struct CheckpointWeights::Impl {
  std::string description;
  std::vector<std::unique_ptr<io::SafetensorsFile>> files;
  std::map<std::string, const io::SafetensorsFile*> by_name;

  void add_file(const std::string& path) {
    files.push_back(std::make_unique<io::SafetensorsFile>(path));
    for (const auto& name : files.back()->names()) {
      auto [it, inserted] = by_name.emplace(name, files.back().get());
      KILN_CHECK(inserted, path << ": tensor '" << name << "' also appears in " << it->second->path());
    }
  }

  void add_index(const std::string& index_path) {
    std::ifstream in(index_path);
    KILN_CHECK(in.good(), index_path << ": cannot open");
    const auto j = nlohmann::json::parse(in, nullptr, false);
    KILN_CHECK(!j.is_discarded() && j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
               index_path << ": not a safetensors index (expected a JSON object with a 'weight_map' object)");
    std::map<std::string, std::vector<std::string>> names_by_shard;
    for (auto& [name, shard] : j["weight_map"].items()) {
      KILN_CHECK(shard.is_string(), index_path << ": weight_map entry '" << name << "' is not a file name");
      names_by_shard[shard.get<std::string>()].push_back(name);
    }
    const fs::path dir = fs::path(index_path).parent_path();
    for (const auto& [shard, names] : names_by_shard) {
      const std::string shard_path = (dir / shard).string();
      KILN_CHECK(fs::exists(shard_path), index_path << ": shard '" << shard << "' listed in weight_map does not exist");
      add_file(shard_path);
      for (const auto& name : names)
        KILN_CHECK(by_name.count(name) && by_name[name]->path() == shard_path,
                   index_path << ": weight_map places '" << name << "' in " << shard << " but that file lacks it");
    }
  }
};

CheckpointWeights::CheckpointWeights(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->description = path;
  if (fs::is_directory(path)) {
    // diffusers names its weights diffusion_pytorch_model.*, transformers model.*; either may be sharded.
    for (const char* stem : {"diffusion_pytorch_model", "model"}) {
      const fs::path single = fs::path(path) / (std::string(stem) + ".safetensors");
      const fs::path index = fs::path(path) / (std::string(stem) + ".safetensors.index.json");
      if (fs::exists(index)) {
        impl_->add_index(index.string());
        return;
      }
      if (fs::exists(single)) {
        impl_->add_file(single.string());
        return;
      }
    }
    KILN_FAIL(path << ": no weights found (expected diffusion_pytorch_model.safetensors, model.safetensors or a "
                      "sharded *.safetensors.index.json)");
  }
  if (path.size() > 11 && path.ends_with(".index.json")) {
    impl_->add_index(path);
  } else {
    impl_->add_file(path);
  }
}

CheckpointWeights::~CheckpointWeights() = default;

bool CheckpointWeights::contains(const std::string& name) const { return impl_->by_name.count(name) != 0; }

Shape CheckpointWeights::shape(const std::string& name) const {
  KILN_CHECK(contains(name), impl_->description << ": no tensor named '" << name << "'");
  return impl_->by_name.at(name)->info(name).shape;
}

Tensor CheckpointWeights::load(const std::string& name) const {
  KILN_CHECK(contains(name), impl_->description << ": no tensor named '" << name << "'");
  return impl_->by_name.at(name)->tensor(name);
}

std::vector<std::string> CheckpointWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : impl_->by_name) out.push_back(name);
  return out;
}

std::string CheckpointWeights::description() const { return impl_->description; }

DType CheckpointWeights::stored_dtype(const std::string& name) const {
  KILN_CHECK(contains(name), impl_->description << ": no tensor named '" << name << "'");
  return impl_->by_name.at(name)->info(name).dtype;
}

}  // namespace kiln::nn
