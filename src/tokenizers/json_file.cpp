#include "tokenizers/json_file.h"

#include <fstream>
#include <iterator>

#include "io/json_depth.h"
#include "kiln/core/error.h"

namespace kiln::tokenizers {

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f, path.string() << ": cannot open file");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  io::check_json_depth(text, path.string());
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL(path.string() << ": invalid JSON (" << e.what() << ")");
  }
}

}  // namespace kiln::tokenizers
