#include "cli/serve/generation_params.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/serve/base64.h"
#include "kiln/core/limits.h"
#include "kiln/pipelines/request_fields.h"

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

uint64_t seed_field(const std::string& field, const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) refuse(field, "expected an integer from 0 to 2^64-1, got " + v.dump());
  refuse(field, std::string("expected an integer from 0 to 2^64-1, got ") + type_name(v));
}

double number_field(const RequestField& f, const json& v) {
  const std::string& field = f.json;
  // The field's range ("a finite value >= 0", "in [0, 1]") said of a JSON number.
  const std::string range = f.range(), finite = "a finite value";
  const std::string bounds = range.rfind(finite, 0) == 0 ? range.substr(finite.size()) : " " + range;
  if (!v.is_number()) refuse(field, "expected a number" + bounds + ", got " + std::string(type_name(v)));
  const double x = v.get<double>();
  if (!f.within(x)) refuse(field, "expected a finite number" + bounds + ", got " + v.dump());
  return x;
}

// An image in JSON: a PNG file in base64, after an optional data URL prefix.
Image image_field(const std::string& field, const json& v) {
  if (!v.is_string())
    refuse(field, std::string("expected a PNG image in base64 (a string), got ") + type_name(v));
  return request_image_base64(field, v.get_ref<const std::string&>());
}

}  // namespace

Image request_image_base64(const std::string& field, std::string_view text) {
  if (text.rfind("data:", 0) == 0) {
    const size_t comma = text.find(',');
    if (comma == std::string_view::npos || text.substr(0, comma).find(";base64") == std::string_view::npos)
      refuse(field, "a data URL of an image must be base64 (data:image/png;base64,...)");
    text.remove_prefix(comma + 1);
  }
  const std::optional<std::string> png = base64_decode(text);
  if (!png) refuse(field, "expected a PNG image in base64, got text that is not base64");
  return request_image(field, *png);
}

namespace {

// A request field's value from its JSON, by the field's kind, checked against its range.
FieldValue field_value(const RequestField& f, const json& v) {
  const std::string& field = f.json;
  const auto bound = [](const std::optional<double>& b, int64_t otherwise) {
    return b ? static_cast<int64_t>(*b) : otherwise;
  };
  switch (f.kind) {
    case FieldKind::Text:
      return string_field(field, v);
    case FieldKind::Integer:
      return integer_field(field, v, bound(f.min, std::numeric_limits<int64_t>::min()),
                           bound(f.max, std::numeric_limits<int64_t>::max()));
    case FieldKind::IntegerList: {
      if (!v.is_array()) refuse(field, "expected a list of integers, got " + std::string(type_name(v)));
      std::vector<int64_t> values;
      for (const json& e : v)
        values.push_back(integer_field(field, e, bound(f.min, std::numeric_limits<int64_t>::min()),
                                       bound(f.max, std::numeric_limits<int64_t>::max())));
      return values;
    }
    case FieldKind::Number:
      return number_field(f, v);
    case FieldKind::Boolean:
      if (!v.is_boolean()) refuse(field, std::string("expected true or false, got ") + type_name(v));
      return v.get<bool>();
    case FieldKind::Choice: {
      const std::string s = v.is_string() ? v.get<std::string>() : "";
      if (std::find(f.choices.begin(), f.choices.end(), s) == f.choices.end())
        refuse(field, "expected " + f.accepted() + ", got " + shown(v));
      return s;
    }
    case FieldKind::Generator:
      return Generator(seed_field(field, v));
    case FieldKind::Image:
      return image_field(field, v);
    case FieldKind::ImageList: {
      if (!v.is_array()) return std::vector<Image>{image_field(field, v)};
      if (v.size() > kMaxRequestImages)
        refuse(field, std::to_string(v.size()) + " images; at most " + std::to_string(kMaxRequestImages));
      std::vector<Image> images;
      for (const json& e : v) images.push_back(image_field(field, e));
      return images;
    }
    default:
      refuse(field, std::string("a ") + field_kind_name(f.kind) + " is not read from JSON");
  }
}

// The JSON of a field's value (what field_value reads back to the same value).
json field_json(const RequestField& f, const FieldValue& value) {
  if (f.kind == FieldKind::Generator) return std::get<Generator>(value).initial_seed();
  if (f.kind == FieldKind::Image) return base64_encode(std::get<Image>(value).encode_png());
  if (f.kind == FieldKind::ImageList) {
    json images = json::array();
    for (const Image& image : std::get<std::vector<Image>>(value))
      images.push_back(base64_encode(image.encode_png()));
    return images;
  }
  return std::visit(
      [](const auto& v) -> json {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string> || std::is_same_v<V, int64_t> ||
                      std::is_same_v<V, double> || std::is_same_v<V, bool> ||
                      std::is_same_v<V, std::vector<int64_t>>)
          return v;
        else
          return nullptr;
      },
      value);
}

// The request field a body's key names, if it names one the server reads.
const RequestField* served_field(const std::string& key) {
  for (const RequestField& f : request_fields())
    if (!f.json.empty() && f.json == key) return &f;
  return nullptr;
}

// The served fields' names, for the message of an unknown one.
std::string served_names() {
  std::string names = "model, prompt, n, size, response_format, loras";
  for (const RequestField& f : request_fields())
    if (!f.json.empty() && f.json != "prompt" && f.json != "n") names += ", " + f.json;
  return names;
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
  params.request.width = width;
  params.request.height = height;
}

// "loras": [{"name": "style", "scale": 0.8}, ...]: names of plain files (no path), finite scales.
void read_loras(const json& v, GenerationParams& params) {
  const char* key = "loras";
  if (!v.is_array())
    refuse(key, std::string("expected a list of {\"name\": ..., \"scale\": ...}, got ") + type_name(v));
  if (v.size() > kMaxRequestLoras)
    refuse(key, std::to_string(v.size()) + " adapters; at most " + std::to_string(kMaxRequestLoras) +
                    " per request");
  for (const json& entry : v) {
    if (!entry.is_object())
      refuse(key, std::string("each adapter is {\"name\": ..., \"scale\": ...}, got ") + type_name(entry));
    LoraChoice choice;
    for (const auto& [field, value] : entry.items()) {
      if (field == "name") {
        if (!value.is_string() || value.get<std::string>().empty())
          refuse(key, "an adapter's name must be a non-empty string, got " + shown(value));
        choice.name = value.get<std::string>();
        if (choice.name.size() > 255 || choice.name.find_first_of("/\\") != std::string::npos ||
            choice.name.front() == '.' || choice.name.find('\0') != std::string::npos)
          refuse(key, "an adapter's name is a file name in the server's --lora-dir (no path), got " +
                          shown(value));
      } else if (field == "scale" || field == "weight") {
        if (!value.is_number() || !std::isfinite(value.get<double>()) || std::fabs(value.get<double>()) > 1e6)
          refuse(key, "an adapter's scale must be a finite number, got " + shown(value));
        choice.scale = value.get<double>();
      } else {
        refuse(key, "an adapter has a name and a scale; unknown key " + shown(json(field)));
      }
    }
    if (choice.name.empty()) refuse(key, "an adapter needs a name");
    for (const LoraChoice& other : params.loras)
      if (other.name == choice.name) refuse(key, "adapter " + shown(json(choice.name)) + " is named twice");
    params.loras.push_back(std::move(choice));
  }
}

void read_field(const std::string& key, const json& v, GenerationParams& params) {
  if (key == "model") {
    params.model = string_field(key, v);
  } else if (key == "loras") {
    read_loras(v, params);
  } else if (key == "size") {
    read_size(v, params);
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
  } else if (const RequestField* f = served_field(key)) {
    const FieldValue value = field_value(*f, v);
    try {
      f->set(params.request, value);
    } catch (const RequestError& e) {
      refuse(key, e.what());
    }
  } else if (ignored_openai_fields().count(key) == 0) {
    refuse(key, "unknown field (expected " + served_names() + ")");
  }
}

}  // namespace

json parse_request_body(std::string_view body) {
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

std::optional<uint64_t> GenerationParams::seed() const {
  if (!request.generator) return std::nullopt;
  return request.generator->initial_seed();
}

// The field's name as the body gave it, unless it needs quoting (an unknown field may be any string).
std::string field_for_message(const std::string& field) {
  const bool plain =
      !field.empty() && field.size() <= 64 && std::all_of(field.begin(), field.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
      });
  return plain ? field : quoted(field, 64);
}

Image request_image(const std::string& field, std::string_view png) {
  try {
    Image image = Image::decode_png(png, field, kMaxRequestImagePixels);
    image.metadata
        .clear();  // an upload's text chunks are not the job's (nor always keys a PNG may be written with)
    return image;
  } catch (const Error& e) {
    // read_png's message names the field already ("read_png: image: not a PNG file").
    std::string message = e.what();
    const std::string prefix = "read_png: " + field + ": ";
    if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
    refuse(field, "expected a PNG image: " + message);
  }
}

GenerationParams parse_generation_params(std::string_view body) {
  return generation_params_from(parse_request_body(body));
}

GenerationParams generation_params_from(const json& j, bool prompt_required) {
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
  if (!has_prompt && prompt_required) refuse("prompt", "required: the text to make an image of");
  return params;
}

std::string to_json_text(const GenerationParams& params, bool images) {
  const PipelineRequest& r = params.request;
  json j = json::object();
  if (!params.model.empty()) j["model"] = params.model;
  // OpenAI's fields as OpenAI's clients send them: the size as "WxH", n always.
  const bool size = r.height.has_value() && r.width.has_value();
  if (size) j["size"] = std::to_string(*r.width) + "x" + std::to_string(*r.height);
  j["n"] = r.num_images_per_prompt;
  for (const RequestField& f : request_fields()) {
    if (f.json.empty() || (size && (f.name == "height" || f.name == "width"))) continue;
    if (!images && (f.kind == FieldKind::Image || f.kind == FieldKind::ImageList)) continue;
    if (f.is_set(r) || f.name == "prompt") j[f.json] = field_json(f, f.get(r));
  }
  j["response_format"] = params.response_format == ResponseFormat::Url ? "url" : "b64_json";
  if (!params.loras.empty()) {
    json loras = json::array();
    for (const LoraChoice& l : params.loras) loras.push_back({{"name", l.name}, {"scale", l.scale}});
    j["loras"] = loras;
  }
  return j.dump();
}

PipelineRequest to_pipeline_request(const GenerationParams& params, uint64_t seed) {
  PipelineRequest request = params.request;
  request.generator = Generator(seed);
  return request;
}

std::string json_field_of(const std::string& request_field) {
  // The size comes as OpenAI's "size" ("WxH"), which clients send rather than height and width.
  if (request_field == "height" || request_field == "width") return "size";
  const RequestField* f = find_request_field(request_field);
  return f != nullptr && !f->json.empty() ? f->json : request_field;
}

}  // namespace kiln::serve
