// tokenizers-library tokenizer.json files (model, added_tokens, normalizer, pre_tokenizer, post_processor).
// Every loader of tokenizer.json is offered every input: today T5's (a Unigram model); FLUX.2's BPE
// tokenizers (Mistral/Tekken, Qwen) get theirs from the flux2-text work, and it joins kLoaders below, so the
// corpus, which already holds BPE files, drives it from its first run.
#include "fuzz_support.h"
#include "kiln/tokenizers/t5_tokenizer.h"
#include "tokenizer_probe.h"

using namespace kiln;

namespace {

using Loader = void (*)(const std::string& path);

void load_t5(const std::string& path) {
  fuzz::probe_tokenizer(tokenizers::T5Tokenizer::from_tokenizer_json(path));
}

constexpr Loader kLoaders[] = {load_t5};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file("tokenizer.json");
  file.assign({reinterpret_cast<const char*>(data), size});
  for (Loader load : kLoaders) fuzz::expect_clean([&] { load(file.path()); });
  return 0;
}
