#include "kiln/io/component_config.h"

#include <filesystem>

#include "kiln/core/error.h"

namespace kiln::io {

std::string config_file_in(const std::string& path, const std::string& file_name) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return (std::filesystem::path(path) / file_name).string();
  return path;
}

ComponentConfig load_model_config(const std::string& path) {
  ComponentConfig c;
  c.path = config_file_in(path, "config.json");
  c.values = JsonConfig::load(c.path);
  if (c.values.has("_class_name")) {
    c.class_name = c.values.get<std::string>("_class_name");
    c.library_version = c.values.get_or<std::string>("_diffusers_version", "");
  } else if (c.values.has("architectures")) {
    const auto archs = c.values.get<std::vector<std::string>>("architectures");
    KILN_CHECK(!archs.empty(), c.values.where("architectures") << " is empty (expected the model class)");
    c.class_name = archs.front();
    c.library_version = c.values.get_or<std::string>("transformers_version", "");
  } else {
    KILN_FAIL(c.path << ": no model class: expected \"_class_name\" (diffusers) or \"architectures\" "
                        "(transformers)");
  }
  return c;
}

ComponentConfig load_scheduler_config(const std::string& path) {
  ComponentConfig c;
  c.path = config_file_in(path, "scheduler_config.json");
  c.values = JsonConfig::load(c.path);
  c.class_name = c.values.get<std::string>("_class_name");
  c.library_version = c.values.get_or<std::string>("_diffusers_version", "");
  return c;
}

TokenizerConfig load_tokenizer_config(const std::string& path) {
  TokenizerConfig t;
  t.path = config_file_in(path, "tokenizer_config.json");
  t.values = JsonConfig::load(t.path);
  t.class_name = t.values.get_or<std::string>("tokenizer_class", "");
  if (t.values.has("model_max_length")) {
    // An integer that is not absurdly large is a real limit; floats (1e30) and huge integers mean none.
    const std::string type = t.values.type_of("model_max_length");
    KILN_CHECK(type == "number", t.values.where("model_max_length") << ": expected a number, got " << type);
    const double v = t.values.get<double>("model_max_length");
    if (v > 0 && v < 1e15) t.model_max_length = t.values.get<int64_t>("model_max_length");
  }
  for (const char* key :
       {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
    if (!t.values.has(key)) continue;
    if (t.values.type_of(key) == "object")
      t.special_tokens[key] = t.values.object(key).get<std::string>("content");
    else
      t.special_tokens[key] = t.values.get<std::string>(key);
  }
  return t;
}

}  // namespace kiln::io
