// Tokenizer files with values of the wrong type or out of range: each is a kiln::Error naming the file. The
// inputs are fuzz/crashes/clip_bpe/ (vocab.json, merges.txt and tokenizer_config.json, NUL-separated, as the
// clip_bpe fuzz target reads them); before the fixes, each aborted the process (docs/reliability.md).
#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "kiln/tokenizers/clip_tokenizer.h"
#include "kiln/tokenizers/t5_tokenizer.h"
#include "support/test_data.h"

namespace kiln::tokenizers {
namespace {

using kiln::testing::read_bytes;
using kiln::testing::temp_dir;
using kiln::testing::write_bytes;

// Splits a clip_bpe input into the three files; returns the folder holding them.
std::string clip_files(const std::string& reproducer) {
  const std::string bytes = read_bytes(kiln::testing::data_path("../../fuzz/crashes/clip_bpe/" + reproducer));
  const size_t a = bytes.find('\0'), b = bytes.find('\0', a + 1);
  const std::string dir = temp_dir("clip_" + reproducer);
  write_bytes(dir + "/vocab.json", bytes.substr(0, a));
  write_bytes(dir + "/merges.txt", bytes.substr(a + 1, b - a - 1));
  write_bytes(dir + "/tokenizer_config.json", bytes.substr(b + 1));
  return dir;
}

TEST(TokenizerFiles, WronglyTypedConfigValuesAreErrors) {
  // nlohmann's type_error escaped as a foreign exception.
  EXPECT_KILN_ERROR(ClipTokenizer::from_directory(clip_files("config-lstrip-not-a-boolean")),
                    "tokenizer_config.json", "malformed tokenizer config", "must be boolean");
}

TEST(TokenizerFiles, NegativeModelMaxLengthIsAnError) {
  // -1e30 converted to int64 was undefined behaviour (UBSan: outside the range of representable values).
  EXPECT_KILN_ERROR(ClipTokenizer::from_directory(clip_files("config-model-max-length-minus-1e30")),
                    "tokenizer_config.json: model_max_length -1e+30 must be at least 1");
}

TEST(TokenizerFiles, AbsurdExtraIdsAreRefusedBeforeReserving) {
  EXPECT_KILN_ERROR(T5Tokenizer::from_sentencepiece(kiln::testing::data_path("tokenizers/t5/spiece.model"),
                                                    int64_t{1} << 40),
                    "extra_ids 1099511627776 must be between 0 and 4194304");
}

}  // namespace
}  // namespace kiln::tokenizers
