// Tokenizer files under fuzz/crashes/ that once crashed a loader, with the error they must give now
// (docs/reliability.md).
#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "kiln/tokenizers/t5_tokenizer.h"
#include "support/test_data.h"

namespace kiln::tokenizers {
namespace {

std::string reproducer(const std::string& target, const std::string& name) {
  return kiln::testing::data_path("../../fuzz/crashes/" + target + "/" + name);
}

TEST(TokenizerFuzzRegressions, TokenizerJsonNestedTooDeep) {
  const std::string path = reproducer("tokenizer_json", "json-nested-100000-deep-in-vocab");
  EXPECT_KILN_ERROR(T5Tokenizer::from_tokenizer_json(path), path, "JSON nested deeper than 64 levels");
}

}  // namespace
}  // namespace kiln::tokenizers
