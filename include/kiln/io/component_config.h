// The configuration files inside a component folder of a diffusers pipeline:
//   config.json            models (diffusers: "_class_name"; transformers: "architectures")
//   scheduler_config.json  schedulers ("_class_name")
//   tokenizer_config.json  tokenizers ("tokenizer_class", special tokens, model_max_length)
// Each loader accepts the file itself or the folder holding it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "kiln/io/json_config.h"

namespace kiln::io {

struct ComponentConfig {
  std::string path;        // the JSON file read
  std::string class_name;  // "FluxTransformer2DModel", "T5EncoderModel", "FlowMatchEulerDiscreteScheduler"
  std::string library_version;  // "_diffusers_version" or "transformers_version"; empty when absent
  JsonConfig values;            // every field, for the model's own typed config struct
};

// config.json of a model. The class comes from "_class_name" (diffusers) or "architectures"[0]
// (transformers); throws naming the file when neither is there.
ComponentConfig load_model_config(const std::string& path);
// scheduler_config.json; "_class_name" is required.
ComponentConfig load_scheduler_config(const std::string& path);

struct TokenizerConfig {
  std::string path;
  std::string class_name;  // "tokenizer_class": "CLIPTokenizer", "T5TokenizerFast", ...
  // The longest input the model accepts; absent when the file says "unlimited" (transformers writes a huge
  // number such as 1e30 for that).
  std::optional<int64_t> model_max_length;
  // bos_token, eos_token, unk_token, pad_token, sep_token, cls_token, mask_token: the token text, whether the
  // file gives it as a string or as an AddedToken object {"content": ...}. Null tokens are left out.
  std::map<std::string, std::string> special_tokens;
  JsonConfig values;
};

TokenizerConfig load_tokenizer_config(const std::string& path);

// The file `file_name` inside `path` when `path` is a folder, else `path` itself.
std::string config_file_in(const std::string& path, const std::string& file_name);

}  // namespace kiln::io
