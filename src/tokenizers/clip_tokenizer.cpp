#include "kiln/tokenizers/clip_tokenizer.h"

#include <fstream>
#include <optional>
#include <unordered_map>

#include "kiln/core/error.h"
#include "tokenizers/added_vocabulary.h"
#include "tokenizers/bpe_model.h"
#include "tokenizers/byte_level.h"
#include "tokenizers/encode_layout.h"
#include "tokenizers/json_file.h"
#include "tokenizers/text_normalizer.h"
#include "tokenizers/tokenizer_config.h"
#include "tokenizers/unicode.h"

namespace kiln::tokenizers {
namespace {

constexpr std::string_view kStartOfText = "<|startoftext|>";
constexpr std::string_view kEndOfText = "<|endoftext|>";

// Byte length of the code point at pos and its class in CLIP's pattern.
enum class CharClass { Letter, Number, Space, Other };
CharClass classify(std::string_view s, size_t pos, size_t& next) {
  next = pos;
  const unicode::CharProperties p =
      unicode::properties(unicode::next_code_point(s, next, "CLIP pre-tokenizer"));
  if (p.letter) return CharClass::Letter;
  if (p.number) return CharClass::Number;
  if (p.white_space) return CharClass::Space;
  return CharClass::Other;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at pos, or 0.
size_t contraction_at(std::string_view s, size_t pos) {
  if (s[pos] != '\'') return 0;
  for (std::string_view c : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"}) {
    if (s.substr(pos, c.size()) == c) return c.size();
  }
  return 0;
}

// End of the run of characters of class `cls` starting at pos.
size_t run_end(std::string_view s, size_t pos, CharClass cls) {
  size_t next;
  while (pos < s.size() && classify(s, pos, next) == cls) pos = next;
  return pos;
}

// CLIP's pre-tokenisation pattern, hand-coded:
//   <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
// The matches are the pieces; whatever lies between them (whitespace) is dropped.
std::vector<std::string_view> clip_pre_tokenize(std::string_view s) {
  std::vector<std::string_view> pieces;
  size_t pos = 0, next;
  while (pos < s.size()) {
    size_t end;
    if (s.substr(pos, kStartOfText.size()) == kStartOfText) {
      end = pos + kStartOfText.size();
    } else if (s.substr(pos, kEndOfText.size()) == kEndOfText) {
      end = pos + kEndOfText.size();
    } else if (const size_t c = contraction_at(s, pos)) {
      end = pos + c;
    } else {
      const CharClass kind = classify(s, pos, next);
      if (kind == CharClass::Space) {
        pos = next;
        continue;
      }
      // A number is one character; letters and other symbols run on.
      end = kind == CharClass::Number ? next : run_end(s, pos, kind);
    }
    pieces.push_back(s.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

// The GPT-2 pattern that ByteLevel(use_regex=true) applies inside each piece. CLIP's pieces hold no
// whitespace, so it reduces to: contractions, letter runs, number runs, runs of other characters.
std::vector<std::string_view> gpt2_split(std::string_view s) {
  std::vector<std::string_view> pieces;
  size_t pos = 0, next;
  while (pos < s.size()) {
    size_t end;
    if (const size_t c = contraction_at(s, pos)) {
      end = pos + c;
    } else {
      end = run_end(s, pos, classify(s, pos, next));
    }
    pieces.push_back(s.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

std::vector<std::pair<std::string, std::string>> read_merges(const std::filesystem::path& path) {
  std::ifstream f(path);
  KILN_CHECK(f, path.string() << ": cannot open merges file");
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  for (size_t n = 1; std::getline(f, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    KILN_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                   line.find(' ', space + 1) == std::string::npos,
               path.string() << ": line " << n << " is \"" << line << "\", expected two tokens \"a b\"");
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  return merges;
}

std::unordered_map<std::string, int64_t> read_vocab(const std::filesystem::path& path) {
  const nlohmann::json j = read_json_file(path);
  KILN_CHECK(j.is_object(), path.string() << ": expected a JSON object {\"token\": id}");
  std::unordered_map<std::string, int64_t> vocab;
  vocab.reserve(j.size());
  for (const auto& [token, id] : j.items()) {
    KILN_CHECK(id.is_number_integer(),
               path.string() << ": id of \"" << token << "\" is " << id.dump() << ", expected an integer");
    vocab.emplace(token, id.get<int64_t>());
  }
  return vocab;
}

}  // namespace

struct ClipTokenizer::Impl {
  std::optional<BpeModel> bpe;
  TextNormalizer normalizer;
  AddedVocabulary added;
  int64_t bos = 0, eos = 0, pad = 0;
  int64_t max_length = 77;

  std::vector<int64_t> tokenize(std::string_view text) const {
    std::vector<int64_t> ids;
    for (const TextPiece& piece : added.split(text, normalizer)) {
      if (piece.token_id) {
        ids.push_back(*piece.token_id);
        continue;
      }
      for (std::string_view word : clip_pre_tokenize(piece.text.text)) {
        for (std::string_view sub : gpt2_split(word)) bpe->encode(byte_level_encode(sub), ids);
      }
    }
    return ids;
  }
};

ClipTokenizer::ClipTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClipTokenizer::~ClipTokenizer() = default;
ClipTokenizer::ClipTokenizer(ClipTokenizer&&) noexcept = default;
ClipTokenizer& ClipTokenizer::operator=(ClipTokenizer&&) noexcept = default;

ClipTokenizer ClipTokenizer::from_directory(const std::filesystem::path& dir) {
  KILN_CHECK(std::filesystem::is_directory(dir), dir.string() << ": CLIP tokenizer folder does not exist");
  return from_files(Files{dir / "vocab.json", dir / "merges.txt", dir / "tokenizer_config.json",
                          dir / "special_tokens_map.json"});
}

ClipTokenizer ClipTokenizer::from_files(const Files& files) {
  auto impl = std::make_unique<Impl>();
  const std::string vocab_source = files.vocab.string();
  auto vocab = read_vocab(files.vocab);
  auto merges = read_merges(files.merges);
  const TokenizerConfig config = TokenizerConfig::load(files.tokenizer_config, files.special_tokens_map);

  auto resolve = [&](const char* key, std::string_view fallback) {
    AddedToken t;
    if (const AddedToken* c = config.special(key)) {
      t = *c;
    } else {
      t.content = std::string(fallback);
    }
    auto it = vocab.find(t.content);
    KILN_CHECK(it != vocab.end(),
               vocab_source << ": " << key << " \"" << t.content << "\" is not in the vocabulary");
    t.id = it->second;
    return t;
  };
  const AddedToken bos = resolve("bos_token", kStartOfText);
  const AddedToken eos = resolve("eos_token", kEndOfText);
  const AddedToken unk = resolve("unk_token", kEndOfText);
  const AddedToken pad = resolve("pad_token", kEndOfText);
  impl->bos = bos.id;
  impl->eos = eos.id;
  impl->pad = pad.id;
  if (config.model_max_length) impl->max_length = *config.model_max_length;

  // added_tokens_decoder carries the matching flags; the special tokens are added (if missing) after it.
  for (const AddedToken& t : config.added_tokens) impl->added.add(t);
  for (const AddedToken* t : {&bos, &eos, &unk, &pad}) {
    if (!impl->added.find(t->content)) impl->added.add(*t);
  }

  impl->normalizer.add_nfc();
  impl->normalizer.add_replace(SimplePattern::regex("\\s+", "CLIP normalizer"), " ");
  impl->normalizer.add_lowercase();
  impl->bpe.emplace(std::move(vocab), merges, "</w>", unk.id, vocab_source + " / " + files.merges.string());
  return ClipTokenizer(std::move(impl));
}

std::vector<int64_t> ClipTokenizer::tokenize(std::string_view text) const {
  return impl_->tokenize(text);
}

Encoding ClipTokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  return layout_encoding(impl_->tokenize(text), {impl_->bos}, {impl_->eos}, impl_->pad, impl_->max_length,
                         options, "ClipTokenizer::encode");
}

int64_t ClipTokenizer::bos_id() const {
  return impl_->bos;
}
int64_t ClipTokenizer::eos_id() const {
  return impl_->eos;
}
int64_t ClipTokenizer::pad_id() const {
  return impl_->pad;
}
int64_t ClipTokenizer::model_max_length() const {
  return impl_->max_length;
}
size_t ClipTokenizer::vocab_size() const {
  return impl_->bpe->vocab_size();
}
int64_t ClipTokenizer::token_to_id(std::string_view token) const {
  return impl_->bpe->id_of(token);
}

}  // namespace kiln::tokenizers
