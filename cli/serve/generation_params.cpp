#include "cli/serve/generation_params.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "kiln/core/limits.h"

namespace kiln::serve {

namespace {

using nlohmann::json;

// Request bodies are flat objects. The parser itself does not recurse, but printing or walking a value does,
// once per level, so deeper input is refused while it is read (the rule of io/json_depth for files).
constexpr int kMaxBodyDepth = 8;

// OpenAI fields that change nothing here: accepted so that clients that send them work unchanged.
const std::set<std::string>& ignored_openai_fields() {
  static const std::set<std::string> fields = {"quality",    "style",      "user",
                                               "background", "moderation", "output_compression"};
  return fields;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number with a fraction or exponent";
    default:
      return "an unsupported value";
  }
}

// Text from the body for an error message: its first `max` bytes as a JSON string (quoted, control characters
// and NULs escaped, a UTF-8 sequence cut in two replaced), so that a message is always printable and whole.
std::string quoted(const std::string& s, size_t max = 40) {
  const bool cut = s.size() > max;
  const std::string shown =
      json(cut ? s.substr(0, max) : s).dump(-1, ' ', false, json::error_handler_t::replace);
  return cut ? shown + "..." : shown;
}

// A value for an error message: a string quoted (its first 40 bytes), else its type.
std::string shown(const json& v) {
  if (!v.is_string()) return type_name(v);
  return quoted(v.get_ref<const std::string&>());
}

// The field's name as the body gave it, unless it needs quoting (an unknown field may be any string).
std::string field_for_message(const std::string& field) {
  const bool plain =
      !field.empty() && field.size() <= 64 && std::all_of(field.begin(), field.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
      });
  return plain ? field : quoted(field, 64);
}

[[noreturn]] void refuse(const std::string& field, const std::string& message) {
  throw RequestError(field, field.empty() ? message : field_for_message(field) + ": " + message);
}

// Runs a limits:: check, naming `field` in the RequestError it becomes.
template <class Check>
void within_limits(const std::string& field, Check check) {
  try {
    check();
  } catch (const RequestError&) {
    throw;
  } catch (const Error& e) {
    throw RequestError(field, e.what());
  }
}

std::string string_field(const std::string& field, const json& v) {
  if (!v.is_string()) refuse(field, std::string("expected a string, got ") + type_name(v));
  std::string s = v.get<std::string>();
  within_limits(field, [&] { limits::check_prompt_size(field, s); });
  return s;
}

int64_t integer_field(const std::string& field, const json& v, int64_t min, int64_t max) {
  if (!v.is_number_integer())
    refuse(field, "expected an integer from " + std::to_string(min) + " to " + std::to_string(max) +
                      ", got " + type_name(v));
  // Unsigned values above INT64_MAX are larger than every maximum here.
  const int64_t value =
      v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())
          ? std::numeric_limits<int64_t>::max()
          : v.get<int64_t>();
  within_limits(field, [&] { limits::check_range(field, value, min, max); });
  return value;
}

uint64_t seed_field(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) refuse("seed", "expected an integer from 0 to 2^64-1, got " + v.dump());
  refuse("seed", std::string("expected an integer from 0 to 2^64-1, got ") + type_name(v));
}

float guidance_field(const std::string& key, const json& v) {
  if (!v.is_number()) refuse(key, std::string("expected a number >= 0, got ") + type_name(v));
  const double g = v.get<double>();
  // Within float's range: a larger value would become infinity in the pipeline.
  if (!std::isfinite(g) || g < 0 || g > std::numeric_limits<float>::max())
    refuse(key, "expected a finite number >= 0, got " + v.dump());
  return static_cast<float>(g);
}

// "WxH", each side 1 to kMaxImageSide pixels; "auto" is the pipeline's default size.
void read_size(const json& v, GenerationParams& params) {
  const std::string expected = "expected \"WIDTHxHEIGHT\" in pixels (e.g. \"1024x768\") or \"auto\", got ";
  if (!v.is_string()) refuse("size", expected + shown(v));
  const std::string s = v.get<std::string>();
  if (s == "auto") return;
  const size_t x = s.find('x');
  const auto digits = [](std::string_view d) {
    return !d.empty() && d.size() <= 9 && d.find_first_not_of("0123456789") == std::string_view::npos;
  };
  const std::string_view sv(s);
  if (x == std::string::npos || !digits(sv.substr(0, x)) || !digits(sv.substr(x + 1)))
    refuse("size", expected + shown(v));
  const int64_t width = std::stoll(s.substr(0, x)), height = std::stoll(s.substr(x + 1));
  within_limits("size", [&] {
    limits::check_range("size: width", width, 1, limits::kMaxImageSide);
    limits::check_range("size: height", height, 1, limits::kMaxImageSide);
  });
  params.width = width;
  params.height = height;
}

void read_field(const std::string& key, const json& v, GenerationParams& params) {
  if (key == "model") {
    params.model = string_field(key, v);
  } else if (key == "prompt") {
    params.prompt = string_field(key, v);
  } else if (key == "prompt_2") {
    params.prompt_2 = string_field(key, v);
  } else if (key == "negative_prompt") {
    params.negative_prompt = string_field(key, v);
  } else if (key == "size") {
    read_size(v, params);
  } else if (key == "n") {
    params.n = static_cast<int>(integer_field(key, v, 1, limits::kMaxImagesPerPrompt));
  } else if (key == "seed") {
    params.seed = seed_field(v);
  } else if (key == "steps") {
    params.steps = static_cast<int>(integer_field(key, v, 1, limits::kMaxInferenceSteps));
  } else if (key == "guidance") {
    params.guidance = guidance_field(key, v);
  } else if (key == "true_cfg_scale") {
    params.true_cfg_scale = guidance_field(key, v);
  } else if (key == "max_sequence_length") {
    params.max_sequence_length = integer_field(key, v, 1, limits::kMaxSequenceLength);
  } else if (key == "response_format") {
    const std::string f = v.is_string() ? v.get<std::string>() : "";
    if (f == "b64_json")
      params.response_format = ResponseFormat::B64Json;
    else if (f == "url")
      params.response_format = ResponseFormat::Url;
    else
      refuse(key, "expected \"b64_json\" or \"url\", got " + shown(v));
  } else if (key == "output_format") {
    if (!(v.is_string() && v.get<std::string>() == "png"))
      refuse(key, "Kiln makes PNG images: expected \"png\", got " + shown(v));
  } else if (key == "stream") {
    if (!(v.is_boolean() && !v.get<bool>()))
      refuse(key,
             "streamed partial images are not supported (follow a job's progress with POST /v1/generate "
             "and GET /v1/jobs/{id}/events)");
  } else if (ignored_openai_fields().count(key) == 0) {
    refuse(key,
           "unknown field (expected model, prompt, n, size, response_format, seed, steps, guidance, "
           "true_cfg_scale, negative_prompt, prompt_2, max_sequence_length)");
  }
}

json parse_body(std::string_view body) {
  if (body.size() > kMaxRequestBodyBytes)
    refuse("", "the request body is " + std::to_string(body.size()) + " bytes, more than the maximum " +
                   std::to_string(kMaxRequestBodyBytes));
  const json::parser_callback_t limit_depth = [](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxBodyDepth)
      refuse("", "the request body nests deeper than " + std::to_string(kMaxBodyDepth) + " levels");
    return true;
  };
  try {
    return json::parse(body.begin(), body.end(), limit_depth);
  } catch (const json::exception& e) {
    // e.what() names the byte where the text stops being JSON (and quotes no more than a few bytes).
    refuse("", std::string("the request body is not valid JSON: ") + e.what());
  }
}

}  // namespace

GenerationParams parse_generation_params(std::string_view body) {
  const json j = parse_body(body);
  if (!j.is_object()) refuse("", std::string("expected a JSON object, got ") + type_name(j));
  GenerationParams params;
  bool has_prompt = false;
  for (const auto& [key, value] : j.items()) {
    // Absent and null are the same: the default (OpenAI's clients send null for options left unset).
    if (value.is_null()) {
      if (key == "prompt") refuse("prompt", "expected a string, got null");
      continue;
    }
    read_field(key, value, params);
    has_prompt = has_prompt || key == "prompt";
  }
  if (!has_prompt) refuse("prompt", "required: the text to make an image of");
  return params;
}

std::string to_json_text(const GenerationParams& params) {
  json j = {{"prompt", params.prompt}, {"n", params.n}};
  if (!params.model.empty()) j["model"] = params.model;
  if (params.prompt_2) j["prompt_2"] = *params.prompt_2;
  if (params.negative_prompt) j["negative_prompt"] = *params.negative_prompt;
  if (params.width) j["size"] = std::to_string(*params.width) + "x" + std::to_string(*params.height);
  if (params.seed) j["seed"] = *params.seed;
  if (params.steps) j["steps"] = *params.steps;
  if (params.guidance) j["guidance"] = *params.guidance;
  if (params.true_cfg_scale) j["true_cfg_scale"] = *params.true_cfg_scale;
  if (params.max_sequence_length) j["max_sequence_length"] = *params.max_sequence_length;
  j["response_format"] = params.response_format == ResponseFormat::Url ? "url" : "b64_json";
  return j.dump();
}

PipelineRequest to_pipeline_request(const GenerationParams& params, const std::string& pipeline_class,
                                    uint64_t seed) {
  PipelineRequest request;
  request.prompt = params.prompt;
  if (params.prompt_2)
    (pipeline_class == "StableDiffusion3Pipeline" ? request.prompt_3 : request.prompt_2) = *params.prompt_2;
  request.negative_prompt = params.negative_prompt;
  request.height = params.height;
  request.width = params.width;
  request.num_inference_steps = params.steps;
  request.guidance_scale = params.guidance;
  request.true_cfg_scale = params.true_cfg_scale;
  request.max_sequence_length = params.max_sequence_length;
  request.num_images_per_prompt = params.n;
  request.generator = Generator(seed);
  return request;
}

std::string json_field_of(const std::string& request_field) {
  static const std::map<std::string, std::string> fields = {{"prompt_3", "prompt_2"},
                                                            {"negative_prompt_2", "negative_prompt"},
                                                            {"negative_prompt_3", "negative_prompt"},
                                                            {"height", "size"},
                                                            {"width", "size"},
                                                            {"num_inference_steps", "steps"},
                                                            {"guidance_scale", "guidance"},
                                                            {"num_images_per_prompt", "n"},
                                                            {"generator", "seed"}};
  const auto it = fields.find(request_field);
  return it == fields.end() ? request_field : it->second;
}

}  // namespace kiln::serve
