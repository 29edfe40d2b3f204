#include "tokenizers/tokenizer_config.h"

#include <limits>
#include <utility>

#include "kiln/core/error.h"
#include "tokenizers/json_file.h"

namespace kiln::tokenizers {
namespace {

// A token given as "content" or as {"content": ..., "lstrip": ..., ...}. Plain strings become special tokens
// that match the raw text, as transformers registers them.
AddedToken parse_token(const nlohmann::json& j, const std::string& source, const std::string& key) {
  AddedToken t;
  if (j.is_string()) {
    t.content = j.get<std::string>();
    return t;
  }
  KILN_CHECK(
      j.is_object() && j.contains("content") && j["content"].is_string(),
      source << ": \"" << key << "\" must be a string or an object with \"content\", got " << j.dump());
  t.content = j["content"].get<std::string>();
  t.single_word = j.value("single_word", false);
  t.lstrip = j.value("lstrip", false);
  t.rstrip = j.value("rstrip", false);
  t.normalized = j.value("normalized", false);
  t.special = j.value("special", true);
  return t;
}

void read_specials(const nlohmann::json& j, const std::string& source, TokenizerConfig& c) {
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (j.contains(key) && !j[key].is_null()) c.special_tokens[key] = parse_token(j[key], source, key);
  }
}

}  // namespace

TokenizerConfig TokenizerConfig::load(const std::filesystem::path& tokenizer_config,
                                      const std::filesystem::path& special_tokens_map) {
  try {
    return load_files(tokenizer_config, special_tokens_map);
  } catch (const nlohmann::json::exception& e) {
    // A value of the wrong type ("lstrip": 1, a non-object added_tokens_decoder): nlohmann's own error.
    KILN_FAIL(tokenizer_config.string()
              << " / " << special_tokens_map.string() << ": malformed tokenizer config (" << e.what() << ")");
  }
}

TokenizerConfig TokenizerConfig::load_files(const std::filesystem::path& tokenizer_config,
                                            const std::filesystem::path& special_tokens_map) {
  TokenizerConfig c;
  if (!tokenizer_config.empty() && std::filesystem::exists(tokenizer_config)) {
    const std::string source = tokenizer_config.string();
    const nlohmann::json j = read_json_file(tokenizer_config);
    KILN_CHECK(j.is_object(), source << ": expected a JSON object");
    read_specials(j, source, c);
    if (j.contains("added_tokens_decoder")) {
      for (const auto& [id, tok] : j["added_tokens_decoder"].items()) {
        AddedToken t = parse_token(tok, source, "added_tokens_decoder." + id);
        try {
          t.id = std::stoll(id);
        } catch (const std::exception&) {
          KILN_FAIL(source << ": added_tokens_decoder key \"" << id << "\" is not an integer id");
        }
        c.added_tokens.push_back(std::move(t));
      }
    }
    for (auto [key, field] :
         {std::pair<const char*, std::optional<std::string>*>{"padding_side", &c.padding_side},
          {"truncation_side", &c.truncation_side}}) {
      if (!j.contains(key) || j[key].is_null()) continue;
      KILN_CHECK(j[key].is_string() && (j[key] == "left" || j[key] == "right"),
                 source << ": \"" << key << "\" is " << j[key].dump() << ", expected \"left\" or \"right\"");
      *field = j[key].get<std::string>();
    }
    for (auto [key, field] : {std::pair<const char*, std::optional<bool>*>{"add_bos_token", &c.add_bos_token},
                              {"add_eos_token", &c.add_eos_token}}) {
      if (!j.contains(key) || j[key].is_null()) continue;
      KILN_CHECK(j[key].is_boolean(),
                 source << ": \"" << key << "\" is " << j[key].dump() << ", expected a boolean");
      *field = j[key].get<bool>();
    }
    if (j.contains("model_max_length") && j["model_max_length"].is_number()) {
      // Unlimited tokenizers store 1e30 here.
      const double v = j["model_max_length"].get<double>();
      KILN_CHECK(v >= 1, source << ": model_max_length " << v << " must be at least 1");
      c.model_max_length = v >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v);
    }
  }
  if (!special_tokens_map.empty() && std::filesystem::exists(special_tokens_map)) {
    const nlohmann::json j = read_json_file(special_tokens_map);
    KILN_CHECK(j.is_object(), special_tokens_map.string() << ": expected a JSON object");
    read_specials(j, special_tokens_map.string(), c);
  }
  return c;
}

const AddedToken* TokenizerConfig::special(const std::string& key) const {
  auto it = special_tokens.find(key);
  return it == special_tokens.end() ? nullptr : &it->second;
}

}  // namespace kiln::tokenizers
