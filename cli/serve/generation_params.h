// What a client asks `kiln serve` for, read from a JSON request body. OpenAI's images API
// (POST /v1/images/generations) and Kiln's own POST /v1/generate take the same fields:
//
//   model, prompt, n, size ("WxH"), response_format ("b64_json" or "url"): OpenAI's;
//   seed, steps, guidance, true_cfg_scale, negative_prompt, prompt_2, max_sequence_length: Kiln's.
//
// Parsing is a pure function of the text (the fuzz target calls it). Bad input of any kind, from text that is
// not JSON to a value out of its limit (the CLI's, kiln/core/limits.h), throws a RequestError whose field()
// names the JSON field at fault ("" for the body as a whole), which the server answers with 400.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/pipelines/pipeline_request.h"

namespace kiln::serve {

enum class ResponseFormat { B64Json, Url };

struct GenerationParams {
  std::string model;  // as the client named it; empty: the server's first model
  std::string prompt;
  std::optional<std::string> prompt_2;  // the T5 prompt (FLUX.1's prompt_2, SD3's prompt_3)
  std::optional<std::string> negative_prompt;
  std::optional<int64_t> width, height;  // from size; unset: the pipeline's default
  int n = 1;                             // images, as num_images_per_prompt
  std::optional<uint64_t> seed;          // unset: chosen at random when the job is queued
  std::optional<int> steps;
  std::optional<float> guidance;
  std::optional<float> true_cfg_scale;  // FLUX.1's true classifier-free guidance, with negative_prompt
  std::optional<int64_t> max_sequence_length;
  ResponseFormat response_format = ResponseFormat::B64Json;
};

// The bytes of a request body the server reads at most (larger bodies are refused with 413 before parsing):
// every prompt at its limit, with room to spare.
inline constexpr size_t kMaxRequestBodyBytes = 1 << 20;

// Parses a request body; throws RequestError naming the field (see above).
GenerationParams parse_generation_params(std::string_view body);

// The parameters as a JSON object that parse_generation_params reads back to the same parameters (the job's
// parameters as clients see them, and what rank 0 sends the other ranks under tensor parallelism).
std::string to_json_text(const GenerationParams& params);

// The pipeline request the parameters describe, for a pipeline of class `pipeline_class` (prompt_2 is SD3's
// prompt_3), drawing its noise from `seed`.
PipelineRequest to_pipeline_request(const GenerationParams& params, const std::string& pipeline_class,
                                    uint64_t seed);

// The JSON field behind a pipeline request field that a pipeline refused (RequestError::field()):
// "num_inference_steps" is "steps", "height" is "size".
std::string json_field_of(const std::string& request_field);

}  // namespace kiln::serve
