// tokenizers-library tokenizer.json files (model, added_tokens, normalizer, pre_tokenizer with its regexes,
// post_processor). Every loader of tokenizer.json is offered every input (kLoaders): T5's (a Unigram model)
// and FLUX.2's BPE tokenizer (Mistral/Tekken, Qwen3: byte-level BPE, Split regexes, templates).
#include "fuzz_support.h"
#include "kiln/tokenizers/bpe_tokenizer.h"
#include "kiln/tokenizers/t5_tokenizer.h"
#include "tokenizer_probe.h"

using namespace kiln;

namespace {

using Loader = void (*)(const std::string& path);

void load_t5(const std::string& path) {
  fuzz::probe_tokenizer(tokenizers::T5Tokenizer::from_tokenizer_json(path));
}

void load_bpe(const std::string& path) {
  const tokenizers::BpeTokenizer t = tokenizers::BpeTokenizer::from_files(path);
  fuzz::probe_tokenizer(t);
  // Ids are the file's own (any 32-bit value; the text encoder's embedding checks its range).
  for (std::string_view text : fuzz::kProbeTexts) {
    fuzz::expect_clean([&] {
      for (int64_t id : t.tokenize(text)) fuzz::require(id >= 0 && id <= 0xFFFFFFFFll, "BPE id not 32-bit");
    });
  }
}

constexpr Loader kLoaders[] = {load_t5, load_bpe};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file("tokenizer.json");
  file.assign({reinterpret_cast<const char*>(data), size});
  for (Loader load : kLoaders) fuzz::expect_clean([&] { load(file.path()); });
  return 0;
}
