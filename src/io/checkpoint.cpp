#include "kiln/io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/json_depth.h"
#include "kiln/core/error.h"

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A shard must be a plain file next to the index: no absolute paths, no climbing out with "..".
void check_shard_name(const std::string& index, const std::string& tensor, const std::string& shard) {
  const fs::path p(shard);
  bool climbs = false;
  for (const auto& part : p) climbs |= part == "..";
  KILN_CHECK(!shard.empty() && p.is_relative() && !climbs,
             index << ": weight_map entry '" << tensor << "' names shard '" << shard
                   << "', which is not a file name relative to the index");
}

}  // namespace

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  std::error_code ec;
  KILN_CHECK(fs::exists(path, ec), path << ": no such checkpoint file");
  KILN_CHECK(!fs::is_directory(path, ec), path << ": is a directory; expected a .safetensors file or an "
                                                  ".index.json (use find_checkpoint for a component folder)");
  if (!ends_with(path, ".json")) {
    shards_.push_back(std::make_shared<SafetensorsFile>(path));
    metadata_ = shards_.front()->metadata();
    for (const auto& name : shards_.front()->names()) where_[name] = shards_.front().get();
  } else {
    sharded_ = true;
    std::ifstream in(path, std::ios::binary);
    KILN_CHECK(in.good(), path << ": cannot read the checkpoint index");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    check_json_depth(text, path);
    const auto index = nlohmann::json::parse(text, nullptr, false);
    KILN_CHECK(!index.is_discarded(), path << ": checkpoint index is not valid JSON");
    KILN_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
               path << ": checkpoint index has no \"weight_map\" object (tensor name -> shard file)");
    if (index.contains("metadata") && index["metadata"].is_object())
      for (auto& [k, v] : index["metadata"].items())
        metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();

    const fs::path dir = fs::path(path).parent_path();
    std::map<std::string, SafetensorsFile*> by_shard_name;
    for (auto& [tensor, shard_json] : index["weight_map"].items()) {
      KILN_CHECK(shard_json.is_string(), path << ": weight_map entry '" << tensor << "' is "
                                              << shard_json.dump() << ", expected a file name");
      const std::string shard = shard_json.get<std::string>();
      check_shard_name(path, tensor, shard);
      auto it = by_shard_name.find(shard);
      if (it == by_shard_name.end()) {
        const std::string shard_path = (dir / shard).string();
        KILN_CHECK(fs::exists(shard_path, ec), path << ": shard '" << shard << "' (holding '" << tensor
                                                    << "' and maybe more) is missing: no file " << shard_path
                                                    << " (incomplete download?)");
        shards_.push_back(std::make_shared<SafetensorsFile>(shard_path));
        it = by_shard_name.emplace(shard, shards_.back().get()).first;
      }
      KILN_CHECK(it->second->contains(tensor), path << ": weight_map puts '" << tensor << "' in shard '"
                                                    << shard << "', which has no such tensor");
    }
    // The state dict is every tensor of every shard (as diffusers loads it); a name may live in one shard
    // only.
    for (const auto& shard : shards_) {
      for (const auto& name : shard->names()) {
        auto [it, inserted] = where_.emplace(name, shard.get());
        KILN_CHECK(inserted, path << ": tensor '" << name << "' appears in two shards, " << it->second->path()
                                  << " and " << shard->path());
      }
    }
  }
  for (const auto& [name, file] : where_) names_.push_back(name);
}

const SafetensorsFile& Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  KILN_CHECK(it != where_.end(), path_ << ": no tensor named '" << name << "' (the checkpoint has "
                                       << where_.size() << " tensors)");
  return *it->second;
}

uint64_t Checkpoint::bytes_on_disk() const {
  uint64_t total = 0;
  for (const auto& s : shards_) total += s->file_size();
  return total;
}

namespace {

// "diffusion_pytorch_model.safetensors.index.json" + "fp16" ->
// "diffusion_pytorch_model.safetensors.index.fp16.json": the variant goes before the last extension, the way
// diffusers and transformers name variant files.
std::string with_variant(const std::string& name, const std::string& variant) {
  if (variant.empty()) return name;
  const auto dot = name.rfind('.');
  return name.substr(0, dot) + "." + variant + name.substr(dot);
}

std::string describe_contents(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  if (names.empty()) return "the folder is empty";
  std::ostringstream s;
  s << "it holds: ";
  for (size_t i = 0; i < names.size() && i < 12; ++i) s << (i ? ", " : "") << names[i];
  if (names.size() > 12) s << ", ... (" << names.size() << " entries)";
  return s.str();
}

}  // namespace

std::string find_checkpoint_if_any(const std::string& component_dir, const std::string& variant) {
  std::error_code ec;
  KILN_CHECK(fs::is_directory(component_dir, ec), component_dir << ": not a directory");
  const fs::path dir(component_dir);
  for (const char* base : {"diffusion_pytorch_model", "model"}) {
    const std::string single = std::string(base) + ".safetensors";
    std::vector<std::string> candidates = {with_variant(single + ".index.json", variant)};
    if (!variant.empty()) candidates.push_back(with_variant(single, variant) + ".index.json");
    candidates.push_back(with_variant(single, variant));
    for (const auto& c : candidates) {
      const fs::path p = dir / c;
      // A dangling symlink (a Hugging Face cache whose blob is gone) is an error, not "absent".
      KILN_CHECK(!(fs::is_symlink(p, ec) && !fs::exists(p, ec)),
                 p.string() << ": broken symlink (its target is missing: incomplete download?)");
      if (fs::is_regular_file(p, ec)) return p.string();
    }
  }
  return "";
}

std::string find_checkpoint(const std::string& component_dir, const std::string& variant) {
  const std::string found = find_checkpoint_if_any(component_dir, variant);
  if (!found.empty()) return found;
  const fs::path dir(component_dir);
  std::error_code ec;
  for (const char* legacy : {"diffusion_pytorch_model.bin", "pytorch_model.bin"})
    KILN_CHECK(!fs::exists(dir / legacy, ec), component_dir << ": only a PyTorch pickle checkpoint ("
                                                            << legacy
                                                            << ") is there; Kiln reads safetensors only");
  if (!variant.empty())
    KILN_CHECK(find_checkpoint_if_any(component_dir, "").empty(),
               component_dir << ": no '" << variant << "' variant of the weights (looked for "
                             << with_variant("diffusion_pytorch_model.safetensors", variant) << " and "
                             << with_variant("model.safetensors", variant)
                             << " and their index); the default weights are there: drop the variant");
  KILN_FAIL(component_dir << ": no weights: expected "
                          << with_variant("diffusion_pytorch_model.safetensors", variant) << ", "
                          << with_variant("model.safetensors", variant) << " or their .index.json; "
                          << describe_contents(dir));
}

}  // namespace kiln::io
