// Every input under fuzz/crashes/ that once crashed a loader is replayed here as a named test, with the error
// it must give now (docs/reliability.md lists each finding and its fix). These also run under ASan/UBSan.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/io_test_util.h"
#include "kiln/io/checkpoint.h"
#include "kiln/io/json_config.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/flux_transformer.h"
#include "support/test_data.h"

namespace kiln {
namespace {

std::string reproducer(const std::string& target, const std::string& name) {
  return testing::data_path("../../fuzz/crashes/" + target + "/" + name);
}

// JSON nested 100000 levels deep parsed fine, then overflowed the stack when an error message printed it.
TEST(FuzzRegressions, SafetensorsHeaderNestedTooDeep) {
  const std::string path = reproducer("safetensors", "json-nested-100000-deep-in-shape");
  EXPECT_KILN_ERROR(io::SafetensorsFile{path}, path, "header: JSON nested deeper than 64 levels at byte");
}

TEST(FuzzRegressions, CheckpointIndexNestedTooDeep) {
  const std::string index = testing::temp_dir("fuzz_index_depth") + "/model.safetensors.index.json";
  std::filesystem::copy_file(reproducer("checkpoint_index", "json-nested-100000-deep-in-weight-map"), index);
  EXPECT_KILN_ERROR(io::Checkpoint{index}, index, "JSON nested deeper than 64 levels");
}

TEST(FuzzRegressions, ConfigNestedTooDeep) {
  const std::string path = reproducer("config_json", "json-nested-100000-deep-value");
  EXPECT_KILN_ERROR(io::JsonConfig::load(path), path, "JSON nested deeper than 64 levels");
  EXPECT_KILN_ERROR(models::FluxTransformerConfig::from_file(path), "JSON nested deeper than 64 levels");
}

// A number too large for a double made nlohmann throw out_of_range, which escaped as a foreign exception
// without the file's name (found by the config_json fuzzer in its first campaign hour).
TEST(FuzzRegressions, ConfigNumberBeyondDouble) {
  for (const char* name : {"number-beyond-double-1e6666666666666", "number-beyond-double-in-extra-ids"}) {
    const std::string path = reproducer("config_json", name);
    EXPECT_KILN_ERROR(io::JsonConfig::load(path), path, "not valid JSON", "number overflow");
  }
}

}  // namespace
}  // namespace kiln
