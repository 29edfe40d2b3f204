// SentencePiece model files (T5's spiece.model): the protobuf ModelProto (pieces with scores and types, the
// trainer and normalizer specs, the precompiled charsmap, a darts-clone trie). A model that loads, with
// T5's 100 sentinel tokens appended, tokenises the probe texts.
#include "fuzz_support.h"
#include "kiln/tokenizers/t5_tokenizer.h"
#include "tokenizer_probe.h"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile model("spiece.model");
  model.assign({reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean([&] {
    const tokenizers::T5Tokenizer t = tokenizers::T5Tokenizer::from_sentencepiece(model.path());
    fuzz::probe_tokenizer(t);
  });
  return 0;
}
