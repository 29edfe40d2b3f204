// CLIP's byte-level BPE files: vocab.json ({"token": id}), merges.txt ("#version" line, then "a b" per line)
// and tokenizer_config.json (special and added tokens, model_max_length). The input holds the three files
// separated by NUL bytes (which none of them contains); a missing third part means no tokenizer_config.
// A tokenizer that loads tokenises the probe texts.
#include "fuzz_support.h"
#include "kiln/tokenizers/clip_tokenizer.h"
#include "tokenizer_probe.h"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile vocab("vocab.json"), merges("merges.txt"), config("tokenizer_config.json");
  const auto parts = fuzz::split({reinterpret_cast<const char*>(data), size}, std::string_view("\0", 1), 3);
  vocab.assign(parts[0]);
  merges.assign(parts.size() > 1 ? parts[1] : std::string_view());
  if (parts.size() > 2) config.assign(parts[2]);
  fuzz::expect_clean([&] {
    const tokenizers::ClipTokenizer t =
        tokenizers::ClipTokenizer::from_files({.vocab = vocab.path(),
                                               .merges = merges.path(),
                                               .tokenizer_config = parts.size() > 2 ? config.path() : ""});
    fuzz::probe_tokenizer(t, parts[0].substr(0, 64));
  });
  return 0;
}
