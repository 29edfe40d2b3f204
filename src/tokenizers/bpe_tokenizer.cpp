#include "kiln/tokenizers/bpe_tokenizer.h"

#include <limits>
#include <unordered_map>

#include "kiln/core/error.h"
#include "tokenizers/added_vocabulary.h"
#include "tokenizers/bpe_model.h"
#include "tokenizers/encode_layout.h"
#include "tokenizers/json_file.h"
#include "tokenizers/split_pre_tokenizer.h"
#include "tokenizers/text_normalizer.h"
#include "tokenizers/tokenizer_config.h"

namespace kiln::tokenizers {
namespace {

// A merge is "a b" (tokenizers < 0.20) or ["a", "b"].
std::pair<std::string, std::string> parse_merge(const nlohmann::json& m, size_t index,
                                                const std::string& source) {
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  }
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ', 1);
    if (space != std::string::npos && s.find(' ', space + 1) == std::string::npos) {
      return {s.substr(0, space), s.substr(space + 1)};
    }
  }
  KILN_FAIL(source << ": BPE merge " << index + 1 << " is " << m.dump().substr(0, 80)
                   << ", expected \"a b\" or [\"a\", \"b\"]");
}

// The special-token ids a post_processor puts around a single sequence.
void read_post_processor(const nlohmann::json& post, const std::string& source, std::vector<int64_t>& prefix,
                         std::vector<int64_t>& suffix) {
  if (post.is_null()) return;
  const std::string type = post.value("type", std::string());
  if (type == "Sequence") {
    for (const auto& p : post.at("processors")) read_post_processor(p, source, prefix, suffix);
  } else if (type == "ByteLevel") {
    // Only trims offsets; adds no tokens.
  } else if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    for (const auto& item : post.at("single")) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id");
      for (const auto& id : post.at("special_tokens").at(name).at("ids"))
        (seen_sequence ? suffix : prefix).push_back(id.get<int64_t>());
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    prefix.push_back(post.at("cls").at(1).get<int64_t>());
    suffix.push_back(post.at("sep").at(1).get<int64_t>());
  } else {
    KILN_FAIL(
        source
        << ": unsupported post_processor \"" << type
        << "\" (supported: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence)");
  }
}

}  // namespace

struct BpeTokenizer::Impl {
  std::optional<BpeModel> model;
  TextNormalizer normalizer;
  SplitPreTokenizer pre_tokenizer;
  AddedVocabulary added;
  std::unordered_map<std::string, int64_t> added_ids;
  size_t base_vocab_size = 0;
  std::vector<int64_t> prefix, suffix;
  std::string bos_token;
  std::optional<int64_t> bos, eos, pad;
  PaddingSide padding = PaddingSide::Right;
  bool truncate_left = false;
  int64_t max_length = std::numeric_limits<int64_t>::max();

  int64_t id_of(std::string_view token) const {
    auto it = added_ids.find(std::string(token));
    if (it != added_ids.end()) return it->second;
    return model->id_of(token);
  }

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

  // The id of a special token the config names; nullopt when it names none.
  std::optional<int64_t> resolve(const TokenizerConfig& config, const char* key, const std::string& source) {
    const AddedToken* t = config.special(key);
    if (!t) return std::nullopt;
    const int64_t id = id_of(t->content);
    KILN_CHECK(id >= 0, source << ": " << key << " \"" << t->content
                               << "\" is neither an added token nor in the vocabulary");
    return id;
  }
};

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

BpeTokenizer BpeTokenizer::from_directory(const std::filesystem::path& dir) {
  KILN_CHECK(std::filesystem::is_directory(dir), dir.string() << ": tokenizer folder does not exist");
  KILN_CHECK(
      std::filesystem::exists(dir / "tokenizer.json"),
      dir.string() << ": no tokenizer.json (a BPE tokenizer is read from its tokenizers-library file)");
  return from_files(dir / "tokenizer.json", dir / "tokenizer_config.json", dir / "special_tokens_map.json");
}

BpeTokenizer BpeTokenizer::from_files(const std::filesystem::path& tokenizer_json,
                                      const std::filesystem::path& tokenizer_config,
                                      const std::filesystem::path& special_tokens_map) {
  const std::string source = tokenizer_json.string();
  const nlohmann::json j = read_json_file(tokenizer_json);
  KILN_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
             source << ": expected a tokenizers JSON object with a \"model\"");
  auto impl = std::make_unique<Impl>();
  std::vector<int64_t> file_prefix, file_suffix;
  try {
    const auto& model = j["model"];
    const std::string type = model.value("type", std::string("?"));
    KILN_CHECK(type == "BPE", source << ": model type is \"" << type << "\", expected \"BPE\"");
    KILN_CHECK(model.value("dropout", nlohmann::json()).is_null(),
               source << ": BPE dropout is set; Kiln tokenizes deterministically (dropout must be null)");
    const auto& prefix = model.value("continuing_subword_prefix", nlohmann::json());
    KILN_CHECK(prefix.is_null() || prefix == "",
               source << ": BPE continuing_subword_prefix " << prefix.dump() << " is not supported");
    std::unordered_map<std::string, int64_t> vocab;
    for (const auto& [token, id] : model.at("vocab").items()) {
      KILN_CHECK(id.is_number_integer(), source << ": vocab entry \"" << token << "\" has a non-integer id");
      vocab.emplace(token, id.get<int64_t>());
    }
    impl->base_vocab_size = vocab.size();
    std::vector<std::pair<std::string, std::string>> merges;
    const auto& merge_list = model.at("merges");
    merges.reserve(merge_list.size());
    for (size_t i = 0; i < merge_list.size(); ++i) merges.push_back(parse_merge(merge_list[i], i, source));
    std::optional<int64_t> unk;
    const auto& unk_token = model.value("unk_token", nlohmann::json());
    if (unk_token.is_string()) {
      auto it = vocab.find(unk_token.get<std::string>());
      KILN_CHECK(it != vocab.end(),
                 source << ": unk_token " << unk_token.dump() << " is not in the vocabulary");
      unk = it->second;
    }
    const auto& suffix = model.value("end_of_word_suffix", nlohmann::json());
    BpeOptions options;
    options.ignore_merges = model.value("ignore_merges", false);
    options.byte_fallback = model.value("byte_fallback", false);
    options.fuse_unk = model.value("fuse_unk", false);
    impl->model.emplace(std::move(vocab), merges,
                        suffix.is_string() ? suffix.get<std::string>() : std::string(), unk, source, options);

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
        impl->added_ids[a.content] = a.id;
        impl->added.add(std::move(a));
      }
    }
    impl->normalizer = TextNormalizer::from_json(j.value("normalizer", nlohmann::json()), source);
    impl->pre_tokenizer = SplitPreTokenizer::from_json(j.value("pre_tokenizer", nlohmann::json()), source);
    read_post_processor(j.value("post_processor", nlohmann::json()), source, file_prefix, file_suffix);
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL(source << ": malformed tokenizer.json (" << e.what() << ")");
  }

  const TokenizerConfig config = TokenizerConfig::load(tokenizer_config, special_tokens_map);
  // transformers adds the config's added_tokens_decoder entries the file lacks.
  for (const AddedToken& t : config.added_tokens) {
    if (impl->added.find(t.content)) continue;
    impl->added_ids[t.content] = t.id;
    impl->added.add(t);
  }
  const std::string config_source = tokenizer_config.string();
  impl->bos = impl->resolve(config, "bos_token", config_source);
  impl->eos = impl->resolve(config, "eos_token", config_source);
  impl->pad = impl->resolve(config, "pad_token", config_source);
  if (const AddedToken* b = config.special("bos_token")) impl->bos_token = b->content;
  if (config.model_max_length) impl->max_length = *config.model_max_length;
  impl->padding = config.padding_side.value_or("right") == "left" ? PaddingSide::Left : PaddingSide::Right;
  impl->truncate_left = config.truncation_side.value_or("right") == "left";
  const bool has_post_processor = !j.value("post_processor", nlohmann::json()).is_null();
  if (config.add_bos_token || config.add_eos_token || !has_post_processor) {
    // TokenizersBackend.update_post_processor: "[bos:0] $A:0 [eos:0]" from the flags (both default false).
    if (config.add_bos_token.value_or(false) && impl->bos) impl->prefix.push_back(*impl->bos);
    if (config.add_eos_token.value_or(false) && impl->eos) impl->suffix.push_back(*impl->eos);
  } else {
    impl->prefix = std::move(file_prefix);
    impl->suffix = std::move(file_suffix);
  }
  return BpeTokenizer(std::move(impl));
}

std::vector<int64_t> BpeTokenizer::tokenize(std::string_view text) const {
  return impl_->tokenize(text);
}

Encoding BpeTokenizer::encode(std::string_view text, const BpeEncodeOptions& options) const {
  static const std::vector<int64_t> kNone;
  const bool specials = options.add_special_tokens;
  std::vector<int64_t> ids = impl_->tokenize(text);
  EncodeOptions layout = options;
  layout.pad_to_max_length = false;
  const int64_t max_length = options.max_length > 0 ? options.max_length : impl_->max_length;
  if (impl_->truncate_left && options.truncation && max_length != std::numeric_limits<int64_t>::max()) {
    const auto room =
        max_length - static_cast<int64_t>(specials ? impl_->prefix.size() + impl_->suffix.size() : 0);
    if (room >= 0 && static_cast<int64_t>(ids.size()) > room) ids.erase(ids.begin(), ids.end() - room);
  }
  Encoding e =
      layout_encoding(std::move(ids), specials ? impl_->prefix : kNone, specials ? impl_->suffix : kNone, 0,
                      impl_->max_length, layout, "BpeTokenizer::encode");
  if (!options.pad_to_max_length || static_cast<int64_t>(e.ids.size()) >= max_length) return e;
  KILN_CHECK(max_length != std::numeric_limits<int64_t>::max(),
             "BpeTokenizer::encode: padding to max_length needs a max_length (the tokenizer has no "
             "model_max_length)");
  KILN_CHECK(impl_->pad.has_value(),
             "BpeTokenizer::encode: padding needs a pad token, and the tokenizer has none");
  const auto n = static_cast<size_t>(max_length) - e.ids.size();
  const auto at = impl_->padding == PaddingSide::Left ? 0 : e.ids.size();
  e.ids.insert(e.ids.begin() + static_cast<std::ptrdiff_t>(at), n, *impl_->pad);
  e.attention_mask.insert(e.attention_mask.begin() + static_cast<std::ptrdiff_t>(at), n, 0);
  return e;
}

const std::string& BpeTokenizer::bos_token() const {
  return impl_->bos_token;
}
std::optional<int64_t> BpeTokenizer::bos_id() const {
  return impl_->bos;
}
std::optional<int64_t> BpeTokenizer::eos_id() const {
  return impl_->eos;
}
std::optional<int64_t> BpeTokenizer::pad_id() const {
  return impl_->pad;
}
PaddingSide BpeTokenizer::padding_side() const {
  return impl_->padding;
}
int64_t BpeTokenizer::model_max_length() const {
  return impl_->max_length;
}
size_t BpeTokenizer::vocab_size() const {
  size_t extra = 0;
  for (const auto& [content, id] : impl_->added_ids) {
    if (impl_->model->id_of(content) < 0) ++extra;
  }
  return impl_->base_vocab_size + extra;
}
int64_t BpeTokenizer::token_to_id(std::string_view token) const {
  return impl_->id_of(token);
}

}  // namespace kiln::tokenizers
