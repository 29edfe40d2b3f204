// Prompt text, any bytes of any length, through the committed real tokenizers: CLIP-L (vocab.json and
// merges.txt), T5 from tokenizer.json and T5 from spiece.model. Invalid UTF-8 must be an error, never a read
// past the text; every encoding must be as long as asked, with ids inside the vocabulary.
#include <memory>

#include "fuzz_support.h"
#include "kiln/tokenizers/clip_tokenizer.h"
#include "kiln/tokenizers/t5_tokenizer.h"

using namespace kiln;

namespace {

struct Tokenizers {
  tokenizers::ClipTokenizer clip =
      tokenizers::ClipTokenizer::from_directory(fuzz::source_path("tests/data/tokenizers/clip"));
  tokenizers::T5Tokenizer t5_json =
      tokenizers::T5Tokenizer::from_directory(fuzz::source_path("tests/data/tokenizers/t5"));
  tokenizers::T5Tokenizer t5_spm = tokenizers::T5Tokenizer::from_sentencepiece(
      fuzz::source_path("tests/data/tokenizers/t5/spiece.model"), 100,
      fuzz::source_path("tests/data/tokenizers/t5/tokenizer_config.json"));
};

const Tokenizers& loaded() {
  static const Tokenizers t;
  return t;
}

template <class Tokenizer>
void check(const Tokenizer& t, std::string_view text, int64_t vocab_limit) {
  fuzz::expect_clean([&] {
    for (int64_t max_length : {int64_t{4}, int64_t{77}}) {
      const tokenizers::Encoding e = t.encode(text, {.max_length = max_length});
      fuzz::require(e.ids.size() == static_cast<size_t>(max_length), "encoding not of max_length");
      fuzz::require(e.attention_mask.size() == e.ids.size(), "attention mask of another length");
      for (int64_t id : e.ids) fuzz::require(id >= 0 && id < vocab_limit, "id outside the vocabulary");
    }
    const tokenizers::Encoding unpadded = t.encode(text, {.max_length = 512, .pad_to_max_length = false});
    fuzz::require(unpadded.ids.size() <= 512, "unpadded encoding longer than max_length");
  });
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loaded();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const Tokenizers& t = loaded();
  check(t.clip, text, static_cast<int64_t>(t.clip.vocab_size()));
  check(t.t5_json, text, static_cast<int64_t>(t.t5_json.vocab_size()));
  check(t.t5_spm, text, static_cast<int64_t>(t.t5_spm.vocab_size()));
  return 0;
}
