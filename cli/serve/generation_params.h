// What a client asks `kiln serve` for, read from a JSON request body. OpenAI's images API
// (POST /v1/images/generations) and Kiln's own POST /v1/generate take the same fields:
//
//   model, prompt, n, size ("WxH"), response_format ("b64_json" or "url"): OpenAI's;
//   every request field the one declaration gives a JSON name (kiln/pipelines/request_fields.h: seed, steps,
//   guidance, negative_prompt, prompt_2, prompt_3, strength, ...), read by its kind: Kiln's. Images ("image",
//   one or a list, and "mask_image") are PNG files in base64 (a "data:image/png;base64," prefix allowed).
//
// Parsing is a pure function of the text (the fuzz target calls it). Bad input of any kind, from text that is
// not JSON to a value out of its limit (the CLI's, kiln/core/limits.h), throws a RequestError whose field()
// names the JSON field at fault ("" for the body as a whole), which the server answers with 400.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kiln/pipelines/pipeline_request.h"

namespace kiln::serve {

enum class ResponseFormat { B64Json, Url };

// One adapter a request asks for: a LoRA file of the server's --lora-dir by name, and its weight.
struct LoraChoice {
  std::string name;  // the file's name in --lora-dir, without ".safetensors"
  double scale = 1.0;
};

// At most this many adapters in one request.
inline constexpr size_t kMaxRequestLoras = 16;

struct GenerationParams {
  std::string model;  // as the client named it; empty: the server's first model
  // "loras": [{"name": ..., "scale": ...}]: the adapters this job runs with (unfused, for this job only);
  // empty: none.
  std::vector<LoraChoice> loras;
  // The fields the body sets (unset: the pipeline's defaults); the generator only from "seed" (unset: a seed
  // chosen at random when the job is queued).
  PipelineRequest request;
  ResponseFormat response_format = ResponseFormat::B64Json;

  // The body's "seed", if it gave one.
  std::optional<uint64_t> seed() const;
};

// The bytes of a request body the server reads at most (larger bodies are refused with 413 before parsing):
// the images of an edit (PNG files, in base64 in JSON) with every prompt at its limit.
inline constexpr size_t kMaxRequestBodyBytes = size_t{48} << 20;
// The images one request may carry (an edit's, FLUX.2's references), and the pixels of each (a PNG's header
// larger than this is refused before it is decoded).
inline constexpr size_t kMaxRequestImages = 8;
inline constexpr int64_t kMaxRequestImagePixels = int64_t{4096} * 4096;

// A request body as JSON, as every route reads one: at most kMaxRequestBodyBytes, nesting at most 8 levels
// (deeper input is refused while it is read), valid JSON; throws RequestError (no field) otherwise.
nlohmann::json parse_request_body(std::string_view body);

// Parses a request body; throws RequestError naming the field (see above).
GenerationParams parse_generation_params(std::string_view body);
// The same from a parsed body (an edit's form, cli/serve/edit_form.h, reads its text fields through it); a
// body without a prompt is refused unless `prompt_required` is false.
GenerationParams generation_params_from(const nlohmann::json& body, bool prompt_required = true);

// An image of a request: a PNG file's bytes, decoded, at most kMaxRequestImagePixels; RequestError naming
// `field` for anything else.
Image request_image(const std::string& field, std::string_view png);
// The same from a PNG file in base64 (a "data:image/png;base64," prefix allowed), as JSON bodies carry
// images.
Image request_image_base64(const std::string& field, std::string_view text);

// A field's name for an error message: as given when plain, else JSON-quoted (its first 64 bytes, control
// characters and NULs escaped), so that a message is always printable and whole.
std::string field_for_message(const std::string& field);

// The parameters as a JSON object that parse_generation_params reads back to the same parameters (what rank
// 0 sends the other ranks under tensor parallelism); with `images` false, the images are left out (the job's
// parameters as clients see them: they sent the images).
std::string to_json_text(const GenerationParams& params, bool images = true);

// The pipeline request the parameters describe, drawing its noise from `seed`.
PipelineRequest to_pipeline_request(const GenerationParams& params, uint64_t seed);

// The JSON field behind a pipeline request field that a pipeline refused (RequestError::field()):
// "num_inference_steps" is "steps", "num_images_per_prompt" is "n", "height" is "size".
std::string json_field_of(const std::string& request_field);

}  // namespace kiln::serve
