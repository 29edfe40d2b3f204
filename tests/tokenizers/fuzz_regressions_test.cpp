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

// Every prefix of every piece was kept as a string: one 80000-byte piece took 3.2 GB (past the fuzzers'
// 2 GB limit; found by review, as the corpus's inputs are smaller). The pieces are a trie now, and a piece
// longer than 1024 bytes is refused (each would make segmenting a prompt cost its length times the piece's).
TEST(TokenizerFuzzRegressions, HugeUnigramPieceIsRefused) {
  const double before = kiln::testing::process_status_bytes("VmHWM");
  const std::string path = reproducer("tokenizer_json", "unigram-piece-of-80000-bytes");
  EXPECT_KILN_ERROR(T5Tokenizer::from_tokenizer_json(path), path,
                    "Unigram piece 3 is 80000 bytes, longer than the 1024 a piece may have");
  EXPECT_LT(kiln::testing::process_status_bytes("VmHWM") - before, 100e6);
}

}  // namespace
}  // namespace kiln::tokenizers
