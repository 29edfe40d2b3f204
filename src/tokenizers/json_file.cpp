#include "tokenizers/json_file.h"

#include <fstream>

#include "kiln/core/error.h"

namespace kiln::tokenizers {

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream f(path);
  KILN_CHECK(f, path.string() << ": cannot open file");
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL(path.string() << ": invalid JSON (" << e.what() << ")");
  }
}

}  // namespace kiln::tokenizers
