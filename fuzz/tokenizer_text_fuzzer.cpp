// Prompt text, any bytes of any length, through the committed real tokenizers: CLIP-L (vocab.json and
// merges.txt), T5 from tokenizer.json and T5 from spiece.model, and FLUX.2's BPE tokenizers from
// tokenizer.json (the tiny Mistral of FLUX.2-dev, the Tekken-pattern one, klein's Qwen3), whose
// pre-tokenizer regexes run over the text. Invalid UTF-8 must be an error, never a read past the text; every
// encoding must be as long as asked, with ids inside the vocabulary.
#include <memory>

#include "fuzz_support.h"
#include "kiln/tokenizers/bpe_tokenizer.h"
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
  tokenizers::BpeTokenizer mistral = tokenizers::BpeTokenizer::from_directory(
      fuzz::source_path("tests/data/models/flux2-tiny-dev-full/tokenizer"));
  tokenizers::BpeTokenizer tekken =
      tokenizers::BpeTokenizer::from_directory(fuzz::source_path("tests/data/tokenizers/tekken"));
  tokenizers::BpeTokenizer qwen = tokenizers::BpeTokenizer::from_directory(
      fuzz::source_path("tests/data/models/flux2-tiny-klein-full/tokenizer"));
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

// The same for a BPE tokenizer, padded when it has a pad token (encode refuses to pad without one).
void check_bpe(const tokenizers::BpeTokenizer& t, std::string_view text) {
  const int64_t vocab = static_cast<int64_t>(t.vocab_size());
  fuzz::expect_clean([&] {
    for (int64_t max_length : {int64_t{4}, int64_t{77}}) {
      tokenizers::BpeEncodeOptions options;
      options.max_length = max_length;
      options.pad_to_max_length = t.pad_id().has_value();
      const tokenizers::Encoding e = t.encode(text, options);
      fuzz::require(options.pad_to_max_length ? e.ids.size() == static_cast<size_t>(max_length)
                                              : e.ids.size() <= static_cast<size_t>(max_length),
                    "encoding not of max_length");
      fuzz::require(e.attention_mask.size() == e.ids.size(), "attention mask of another length");
      for (int64_t id : e.ids) fuzz::require(id >= 0 && id < vocab, "id outside the vocabulary");
    }
    for (int64_t id : t.tokenize(text)) fuzz::require(id >= 0 && id < vocab, "id outside the vocabulary");
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
  check_bpe(t.mistral, text);
  check_bpe(t.tekken, text);
  check_bpe(t.qwen, text);
  return 0;
}
