// Named bounds on sizes that come from outside (command-line flags, pipeline call arguments, config files),
// checked before anything is allocated, so that an absurd value is refused with the limit it broke instead of
// exhausting memory or time later. They are far above every released model and every sensible request.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace kiln::limits {

// ---- a generation request
inline constexpr int64_t kMaxImageSide = 16384;  // pixels, height or width
inline constexpr int64_t kMaxInferenceSteps = 1000;
inline constexpr int64_t kMaxImagesPerPrompt = 64;
inline constexpr int64_t kMaxPromptBytes = 64 * 1024;  // each prompt; T5's 512 tokens are about 2-3 KB
inline constexpr int64_t kMaxSequenceLength = 512;     // the T5 tokenizers' model_max_length
inline constexpr int64_t kMaxProcesses = 1024;         // tensor-parallel ranks

// ---- a model config (config.json)
inline constexpr int64_t kMaxLayers = 1024;         // blocks of one kind (FLUX.1: 19 + 38; T5-XXL: 24)
inline constexpr int64_t kMaxWidth = 1 << 20;       // hidden sizes, channels, heads x head dim, FFN widths
inline constexpr int64_t kMaxVocabulary = 1 << 22;  // token embeddings (Mistral/Tekken: 131072)
inline constexpr int64_t kMaxPositions = 1 << 20;   // position tables, sequence lengths
inline constexpr int64_t kMaxStages = 16;           // VAE resolution stages (2^15 pixels per latent pixel)

// Throws kiln::Error "<what> <value> exceeds the maximum <max>" (or "is below the minimum <min>").
void check_range(std::string_view what, int64_t value, int64_t min, int64_t max);
// One size read from a config file, its maximum and (when the reader has no check of its own) its minimum.
struct ConfigBound {
  const char* key;
  int64_t value;
  int64_t max;
  int64_t min = INT64_MIN;
};
// check_range for each, as "<source>: <key> <value> exceeds the maximum <max>".
void check_config(const std::string& source, std::initializer_list<ConfigBound> bounds);
// The same for a prompt's size in bytes: "<what> is N bytes, more than the maximum 65536".
void check_prompt_size(std::string_view what, std::string_view prompt);

}  // namespace kiln::limits
