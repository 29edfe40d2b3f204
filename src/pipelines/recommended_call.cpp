// A model folder's recommended call (kiln/pipelines/pipeline_request.h's RecommendedCall): the values a
// model's makers tell its callers to start from, read strictly (an unknown key or a value out of range is an
// error naming it, before any weight loads).
#include <cmath>
#include <filesystem>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/io/json_config.h"
#include "kiln/pipelines/pipeline_request.h"

namespace kiln {

namespace {

constexpr const char* kFile = "recommended_call.json";

// The value of `key` as a number in [low, high].
double number_in(const io::JsonConfig& f, const std::string& key, double low, double high) {
  KILN_CHECK(f.type_of(key) == "number", f.where(key) << " is " << f.dump(key) << ", expected a number");
  const auto v = f.get<double>(key);
  KILN_CHECK(std::isfinite(v) && v >= low && v <= high, f.where(key) << " is " << f.dump(key)
                                                                     << ", expected a number in [" << low
                                                                     << ", " << high << "]");
  return v;
}

int64_t whole_in(const io::JsonConfig& f, const std::string& key, int64_t low, int64_t high) {
  const double v = number_in(f, key, static_cast<double>(low), static_cast<double>(high));
  KILN_CHECK(v == std::floor(v), f.where(key) << " is " << f.dump(key) << ", expected a whole number");
  return static_cast<int64_t>(v);
}

}  // namespace

PipelineDefaults RecommendedCall::over(PipelineDefaults d) const {
  if (height) d.height = *height;
  if (width) d.width = *width;
  if (num_inference_steps) d.num_inference_steps = *num_inference_steps;
  if (guidance_scale) d.guidance_scale = *guidance_scale;
  if (max_sequence_length) d.max_sequence_length = *max_sequence_length;
  if (strength) d.strength = *strength;
  return d;
}

std::string RecommendedCall::describe() const {
  std::ostringstream s;
  const auto part = [&](const std::string& text) { s << (s.tellp() > 0 ? ", " : "") << text; };
  if (height || width)
    part((width ? std::to_string(*width) : "?") + "x" + (height ? std::to_string(*height) : "?"));
  if (num_inference_steps) part(std::to_string(*num_inference_steps) + " steps");
  if (guidance_scale) {
    std::ostringstream g;
    g << *guidance_scale;
    part("guidance " + g.str());
  }
  if (max_sequence_length) part(std::to_string(*max_sequence_length) + " tokens");
  if (strength) {
    std::ostringstream g;
    g << *strength;
    part("strength " + g.str());
  }
  return s.str();
}

std::optional<RecommendedCall> RecommendedCall::read(const std::string& folder) {
  const std::filesystem::path path = std::filesystem::path(folder) / kFile;
  if (!std::filesystem::is_regular_file(path)) return std::nullopt;
  const io::JsonConfig f = io::JsonConfig::load(path.string());
  RecommendedCall c;
  c.path = path.string();
  for (const std::string& key : f.keys()) {
    if (key.rfind('_', 0) == 0) continue;  // comments and provenance ("_comment")
    if (key == "height")
      c.height = whole_in(f, key, 1, limits::kMaxImageSide);
    else if (key == "width")
      c.width = whole_in(f, key, 1, limits::kMaxImageSide);
    else if (key == "num_inference_steps")
      c.num_inference_steps = static_cast<int>(whole_in(f, key, 1, limits::kMaxInferenceSteps));
    else if (key == "guidance_scale")
      c.guidance_scale = static_cast<float>(number_in(f, key, 0, 1e6));
    else if (key == "max_sequence_length")
      c.max_sequence_length = whole_in(f, key, 1, limits::kMaxSequenceLength);
    else if (key == "strength")
      c.strength = number_in(f, key, 0, 1);
    else
      KILN_FAIL(
          f.where(key) << " is not a recommended call argument (known: height, width, num_inference_steps, "
                          "guidance_scale, max_sequence_length, strength)");
  }
  return c;
}

}  // namespace kiln
