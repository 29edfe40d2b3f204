#include "kiln/tokenizers/t5_tokenizer.h"

#include <optional>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "tokenizers/added_vocabulary.h"
#include "tokenizers/encode_layout.h"
#include "tokenizers/json_file.h"
#include "tokenizers/metaspace_pre_tokenizer.h"
#include "tokenizers/sentencepiece_model.h"
#include "tokenizers/text_normalizer.h"
#include "tokenizers/tokenizer_config.h"
#include "tokenizers/unigram_model.h"

namespace kiln::tokenizers {
namespace {
constexpr int64_t kDefaultModelMaxLength = 512;
}

struct T5Tokenizer::Impl {
  std::optional<UnigramModel> model;
  TextNormalizer normalizer;
  MetaspacePreTokenizer pre_tokenizer;
  AddedVocabulary added;
  std::vector<int64_t> prefix, suffix;  // post-processor specials around the text
  int64_t eos = 1, pad = 0, unk = 2;
  int64_t max_length = kDefaultModelMaxLength;

  std::vector<int64_t> tokenize(std::string_view text) const {
    std::vector<int64_t> ids;
    for (const TextPiece& piece : added.split(text, normalizer)) {
      if (piece.token_id) {
        ids.push_back(*piece.token_id);
        continue;
      }
      for (const NormalizedText& word : pre_tokenizer.pre_tokenize(piece.text)) model->encode(word.text, ids);
    }
    return ids;
  }

  // Id of a special token named in the config (or its default): an added token, else a vocabulary piece.
  int64_t resolve(const TokenizerConfig& config, const char* key, const std::string& fallback,
                  const std::string& source) const {
    const AddedToken* c = config.special(key);
    const std::string content = c ? c->content : fallback;
    if (const AddedToken* t = added.find(content)) return t->id;
    const int64_t id = model->id_of(content);
    KILN_CHECK(id >= 0,
               source << ": " << key << " \"" << content << "\" is neither an added token nor a piece");
    return id;
  }

  void finish(const TokenizerConfig& config, const std::string& source) {
    eos = resolve(config, "eos_token", "</s>", source);
    pad = resolve(config, "pad_token", "<pad>", source);
    unk = resolve(config, "unk_token", "<unk>", source);
    if (config.model_max_length) max_length = *config.model_max_length;
  }
};

T5Tokenizer::T5Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
T5Tokenizer::~T5Tokenizer() = default;
T5Tokenizer::T5Tokenizer(T5Tokenizer&&) noexcept = default;
T5Tokenizer& T5Tokenizer::operator=(T5Tokenizer&&) noexcept = default;

T5Tokenizer T5Tokenizer::from_directory(const std::filesystem::path& dir) {
  KILN_CHECK(std::filesystem::is_directory(dir), dir.string() << ": T5 tokenizer folder does not exist");
  const auto config = dir / "tokenizer_config.json";
  const auto specials = dir / "special_tokens_map.json";
  if (std::filesystem::exists(dir / "tokenizer.json"))
    return from_tokenizer_json(dir / "tokenizer.json", config, specials);
  KILN_CHECK(std::filesystem::exists(dir / "spiece.model"),
             dir.string() << ": T5 tokenizer folder has neither tokenizer.json nor spiece.model");
  int64_t extra_ids = 100;
  if (std::filesystem::exists(config)) {
    const nlohmann::json j = read_json_file(config);
    if (j.is_object() && j.contains("extra_ids") && j["extra_ids"].is_number_integer()) {
      extra_ids = j["extra_ids"].get<int64_t>();
    }
  }
  return from_sentencepiece(dir / "spiece.model", extra_ids, config, specials);
}

T5Tokenizer T5Tokenizer::from_tokenizer_json(const std::filesystem::path& tokenizer_json,
                                             const std::filesystem::path& tokenizer_config,
                                             const std::filesystem::path& special_tokens_map) {
  const std::string source = tokenizer_json.string();
  const nlohmann::json j = read_json_file(tokenizer_json);
  KILN_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
             source << ": expected a tokenizers JSON object with a \"model\"");
  auto impl = std::make_unique<Impl>();
  try {
    const auto& model = j["model"];
    KILN_CHECK(model.value("type", std::string()) == "Unigram",
               source << ": model type is \"" << model.value("type", std::string("?"))
                      << "\", expected \"Unigram\" for a T5 tokenizer");
    std::vector<UnigramModel::Entry> vocab;
    for (const auto& e : model.at("vocab")) {
      KILN_CHECK(
          e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number(),
          source << ": Unigram vocab entry " << e.dump().substr(0, 100) << ", expected [piece, score]");
      vocab.push_back({e[0].get<std::string>(), e[1].get<double>()});
    }
    KILN_CHECK(model.contains("unk_id") && model["unk_id"].is_number_integer(),
               source << ": Unigram model has no integer unk_id");
    impl->model.emplace(std::move(vocab), model["unk_id"].get<int64_t>(), model.value("byte_fallback", false),
                        source);

    if (j.contains("added_tokens")) {
      for (const auto& t : j["added_tokens"]) {
        AddedToken a;
        a.id = t.at("id").get<int64_t>();
        a.content = t.at("content").get<std::string>();
        a.single_word = t.value("single_word", false);
        a.lstrip = t.value("lstrip", false);
        a.rstrip = t.value("rstrip", false);
        a.normalized = t.value("normalized", false);
        a.special = t.value("special", false);
        impl->added.add(std::move(a));
      }
    }
    impl->normalizer = TextNormalizer::from_json(j.value("normalizer", nlohmann::json()), source);
    impl->pre_tokenizer =
        MetaspacePreTokenizer::from_json(j.value("pre_tokenizer", nlohmann::json()), source);

    const nlohmann::json post = j.value("post_processor", nlohmann::json());
    if (!post.is_null()) {
      KILN_CHECK(post.value("type", std::string()) == "TemplateProcessing",
                 source << ": unsupported post_processor \"" << post.value("type", std::string("?"))
                        << "\" (supported: TemplateProcessing)");
      bool seen_sequence = false;
      for (const auto& item : post.at("single")) {
        if (item.contains("Sequence")) {
          seen_sequence = true;
          continue;
        }
        const std::string name = item.at("SpecialToken").at("id");
        const auto& special = post.at("special_tokens").at(name);
        for (const auto& id : special.at("ids"))
          (seen_sequence ? impl->suffix : impl->prefix).push_back(id.get<int64_t>());
      }
    }
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL(source << ": malformed tokenizer.json (" << e.what() << ")");
  }
  impl->finish(TokenizerConfig::load(tokenizer_config, special_tokens_map), source);
  return T5Tokenizer(std::move(impl));
}

T5Tokenizer T5Tokenizer::from_sentencepiece(const std::filesystem::path& spiece_model, int64_t extra_ids,
                                            const std::filesystem::path& tokenizer_config,
                                            const std::filesystem::path& special_tokens_map) {
  const std::string source = spiece_model.string();
  const SentencePieceModel spm = SentencePieceModel::load(spiece_model);
  KILN_CHECK(spm.model_type == 1, source << ": SentencePiece model type " << spm.model_type
                                         << " is not Unigram (1); T5 tokenizers are Unigram");
  KILN_CHECK(extra_ids >= 0 && extra_ids <= limits::kMaxVocabulary,
             source << ": extra_ids " << extra_ids << " must be between 0 and " << limits::kMaxVocabulary);
  auto impl = std::make_unique<Impl>();
  std::vector<UnigramModel::Entry> vocab;
  vocab.reserve(spm.pieces.size() + static_cast<size_t>(extra_ids));
  for (const auto& p : spm.pieces) vocab.push_back({p.piece, static_cast<double>(p.score)});
  for (int64_t i = extra_ids - 1; i >= 0; --i) vocab.push_back({"<extra_id_" + std::to_string(i) + ">", 0.0});
  const auto n_pieces = static_cast<int64_t>(spm.pieces.size());
  impl->model.emplace(std::move(vocab), spm.unk_id, spm.byte_fallback, source);

  // What transformers' T5 conversion registers as special tokens: pad, eos, unk, then the sentinels.
  const TokenizerConfig config = TokenizerConfig::load(tokenizer_config, special_tokens_map);
  for (const auto& [key, fallback] : {std::pair<const char*, const char*>{"pad_token", "<pad>"},
                                      {"eos_token", "</s>"},
                                      {"unk_token", "<unk>"}}) {
    const AddedToken* c = config.special(key);
    const std::string content = c ? c->content : fallback;
    const int64_t id = impl->model->id_of(content);
    KILN_CHECK(id >= 0, source << ": " << key << " \"" << content << "\" is not a piece of the model");
    impl->added.add(AddedToken{content, id});
  }
  for (int64_t i = extra_ids - 1; i >= 0; --i) {
    impl->added.add(AddedToken{"<extra_id_" + std::to_string(i) + ">", n_pieces + (extra_ids - 1 - i)});
  }
  if (!spm.precompiled_charsmap.empty()) {
    impl->normalizer.add_precompiled(std::make_shared<PrecompiledCharsmap>(spm.precompiled_charsmap, source));
  }
  impl->pre_tokenizer = MetaspacePreTokenizer::t5_default();
  impl->finish(config, source);
  impl->suffix = {impl->eos};
  return T5Tokenizer(std::move(impl));
}

std::vector<int64_t> T5Tokenizer::tokenize(std::string_view text) const {
  return impl_->tokenize(text);
}

Encoding T5Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  return layout_encoding(impl_->tokenize(text), impl_->prefix, impl_->suffix, impl_->pad, impl_->max_length,
                         options, "T5Tokenizer::encode");
}

int64_t T5Tokenizer::eos_id() const {
  return impl_->eos;
}
int64_t T5Tokenizer::pad_id() const {
  return impl_->pad;
}
int64_t T5Tokenizer::unk_id() const {
  return impl_->unk;
}
int64_t T5Tokenizer::model_max_length() const {
  return impl_->max_length;
}
size_t T5Tokenizer::vocab_size() const {
  return impl_->model->size();
}
int64_t T5Tokenizer::token_to_id(std::string_view piece) const {
  return impl_->model->id_of(piece);
}

}  // namespace kiln::tokenizers
