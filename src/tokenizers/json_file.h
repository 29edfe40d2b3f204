// Reading the JSON files of a tokenizer folder with errors that name the file.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>

namespace kiln::tokenizers {

// Parses `path`; throws kiln::Error naming the file when it is missing or not valid JSON.
nlohmann::json read_json_file(const std::filesystem::path& path);

}  // namespace kiln::tokenizers
