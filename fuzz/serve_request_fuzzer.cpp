// The request bodies of `kiln serve` (POST /v1/images/generations, POST /v1/generate): any bytes through
// serve::parse_generation_params, which must answer bad input with a RequestError (a kiln::Error) and
// accept only values inside the CLI's limits. A body it accepts must survive the trip the server makes with
// it: written back as JSON (to_json_text, what rank 0 sends the other ranks) and read again to the same
// parameters, and turned into a pipeline request of every class.
#include <string>

#include "cli/serve/generation_params.h"
#include "fuzz_support.h"
#include "kiln/core/limits.h"

using namespace kiln;

namespace {

bool same(const serve::GenerationParams& a, const serve::GenerationParams& b) {
  return a.model == b.model && a.prompt == b.prompt && a.prompt_2 == b.prompt_2 &&
         a.negative_prompt == b.negative_prompt && a.width == b.width && a.height == b.height && a.n == b.n &&
         a.seed == b.seed && a.steps == b.steps && a.guidance == b.guidance &&
         a.max_sequence_length == b.max_sequence_length && a.response_format == b.response_format;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean([&] {
    const serve::GenerationParams params = serve::parse_generation_params(body);
    fuzz::require(params.n >= 1 && params.n <= limits::kMaxImagesPerPrompt, "n out of its limits");
    fuzz::require(!params.steps || (*params.steps >= 1 && *params.steps <= limits::kMaxInferenceSteps),
                  "steps out of its limits");
    fuzz::require(params.width.has_value() == params.height.has_value(), "a size with one side");
    fuzz::require(!params.width || (*params.width >= 1 && *params.width <= limits::kMaxImageSide &&
                                    *params.height >= 1 && *params.height <= limits::kMaxImageSide),
                  "a size out of its limits");
    fuzz::require(!params.guidance || *params.guidance >= 0, "a negative guidance");
    fuzz::require(static_cast<int64_t>(params.prompt.size()) <= limits::kMaxPromptBytes, "a prompt too long");
    const serve::GenerationParams again = serve::parse_generation_params(serve::to_json_text(params));
    fuzz::require(same(params, again), "parameters that do not survive to_json_text");
    for (const char* pipeline : {"FluxPipeline", "StableDiffusion3Pipeline", "Flux2Pipeline"}) {
      const PipelineRequest request = serve::to_pipeline_request(params, pipeline, params.seed.value_or(0));
      fuzz::require(request.num_images_per_prompt == params.n, "n lost on the way to the pipeline");
    }
  });
  return 0;
}
