// Reference ids written by tools/refs/tokenizers.py (transformers' tokenizers run on the fixtures in
// tests/data/tokenizers/), shared by the tokenizer tests.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/test_data.h"

namespace kiln::testing {

inline const nlohmann::json& tokenizer_refs() {
  static const nlohmann::json refs = [] {
    std::ifstream f(data_path("refs/tokenizers.json"));
    return nlohmann::json::parse(f);
  }();
  return refs;
}

inline const nlohmann::json& tokenizer_case(const std::string& name) {
  for (const auto& c : tokenizer_refs()["cases"]) {
    if (c["name"] == name) return c;
  }
  throw std::runtime_error("no tokenizer reference case " + name);
}

inline std::string tokenizer_fixture(const std::string& name) {
  return data_path("tokenizers/" + name);
}

}  // namespace kiln::testing
