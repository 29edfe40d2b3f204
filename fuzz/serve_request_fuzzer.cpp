// The request bodies of `kiln serve` (POST /v1/images/generations, POST /v1/generate; and AUTOMATIC1111's
// POST /sdapi/v1/txt2img and img2img, through serve::a1111_txt2img_body and a1111_img2img_body, whose output
// must be a body Kiln's parser reads or refuses by name): any bytes through serve::parse_generation_params,
// which must answer bad input with a RequestError (a kiln::Error) and accept only values inside the request's
// declared ranges (kiln/pipelines/request_fields.h). A body it accepts must survive the trip the server makes
// with it: written back as JSON (to_json_text, what rank 0 sends the other ranks) and read again to the same
// fields, and turned into a pipeline request that every registered class either takes or refuses with a
// RequestError.
#include <string>
#include <variant>

#include "cli/serve/a1111_params.h"
#include "cli/serve/generation_params.h"
#include "fuzz_support.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/pipelines/request_fields.h"

using namespace kiln;

namespace {

// A served field's value, comparable (the kinds the server reads: texts, integers, numbers, booleans, integer
// lists, the seed).
std::string plain(const RequestField& f, const PipelineRequest& r) {
  if (!f.is_set(r)) return "(unset)";
  const FieldValue v = f.get(r);
  if (const auto* g = std::get_if<Generator>(&v)) return std::to_string(g->initial_seed());
  if (const auto* s = std::get_if<std::string>(&v)) return "s" + *s;
  if (const auto* i = std::get_if<int64_t>(&v)) return "i" + std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "d%.17g", *d);
    return buf;
  }
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  // An image by its size, channels and pixels (the PNG round trip keeps each).
  const auto image = [](const Image& im) {
    return std::to_string(im.width) + "x" + std::to_string(im.height) + "x" + std::to_string(im.channels) +
           ":" + std::string(im.pixels.begin(), im.pixels.end());
  };
  if (const auto* im = std::get_if<Image>(&v)) return image(*im);
  if (const auto* list = std::get_if<std::vector<Image>>(&v)) {
    std::string s = "images";
    for (const Image& im : *list) s += "|" + image(im);
    return s;
  }
  if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) {
    std::string s = "l";
    for (int64_t x : *l) s += std::to_string(x) + ",";
    return s;
  }
  return "(another kind)";
}

bool same(const serve::GenerationParams& a, const serve::GenerationParams& b) {
  if (a.model != b.model || a.response_format != b.response_format || a.loras.size() != b.loras.size())
    return false;
  for (size_t i = 0; i < a.loras.size(); ++i)
    if (a.loras[i].name != b.loras[i].name || a.loras[i].scale != b.loras[i].scale) return false;
  for (const RequestField& f : request_fields())
    if (plain(f, a.request) != plain(f, b.request)) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean([&] { serve::parse_generation_params(serve::a1111_txt2img_body(body)); });
  fuzz::expect_clean([&] { serve::parse_generation_params(serve::a1111_img2img_body(body)); });
  fuzz::expect_clean([&] {
    const serve::GenerationParams params = serve::parse_generation_params(body);
    try {
      check_field_ranges(params.request);
    } catch (const RequestError& e) {
      fuzz::require(false, "an accepted body with a field out of its range");
    }
    const serve::GenerationParams again = serve::parse_generation_params(serve::to_json_text(params));
    fuzz::require(same(params, again), "parameters that do not survive to_json_text");
    const PipelineRequest request = serve::to_pipeline_request(params, params.seed().value_or(0));
    fuzz::require(request.num_images_per_prompt == params.request.num_images_per_prompt,
                  "n lost on the way to the pipeline");
    for (const PipelineClass* c : pipeline_classes()) {
      try {
        c->check_fields(request);
      } catch (const RequestError&) {
        // refused by name: what a class that does not take a field does
      }
    }
  });
  return 0;
}
