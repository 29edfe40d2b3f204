// Reading model config.json files: typed fields with defaults, and errors that name the file and the key.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "kiln/core/error.h"

namespace kiln::models {

class ConfigFields {
 public:
  // Parses `path` (a config.json); throws naming the file when it is missing or not a JSON object.
  static ConfigFields load(const std::string& path) {
    std::ifstream in(path);
    KILN_CHECK(in.good(), path << ": cannot open the model config");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    KILN_CHECK(!j.is_discarded() && j.is_object(), path << ": not a JSON object");
    return ConfigFields(path, std::move(j));
  }
  ConfigFields(std::string path, nlohmann::json json) : path_(std::move(path)), json_(std::move(json)) {}

  bool has(const std::string& key) const { return json_.contains(key) && !json_[key].is_null(); }

  template <class T>
  T get(const std::string& key) const {
    KILN_CHECK(has(key), path_ << ": required key '" << key << "' is missing");
    try {
      return json_[key].get<T>();
    } catch (const nlohmann::json::exception&) {
      KILN_FAIL(path_ << ": key '" << key << "' has the wrong type (" << json_[key].dump() << ")");
    }
  }
  template <class T>
  T get_or(const std::string& key, T fallback) const {
    return has(key) ? get<T>(key) : fallback;
  }
  const std::string& path() const { return path_; }
  const nlohmann::json& json() const { return json_; }

 private:
  std::string path_;
  nlohmann::json json_;
};

}  // namespace kiln::models
