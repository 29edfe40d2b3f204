// kiln serve's request bodies: every field read, every bad value refused with a RequestError naming its JSON
// field, the CLI's limits, and the way back to JSON and on to a pipeline request.
#include "cli/serve/generation_params.h"

#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "kiln/core/limits.h"

namespace kiln::serve {
namespace {

// The field a body is refused for, and its message; fails the test when it is accepted.
std::pair<std::string, std::string> refusal(const std::string& body) {
  try {
    parse_generation_params(body);
  } catch (const RequestError& e) {
    return {e.field(), e.what()};
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

#define EXPECT_REFUSED(body, field, ...)                                   \
  do {                                                                     \
    const auto [f, message] = refusal(body);                               \
    EXPECT_EQ(f, field) << body;                                           \
    EXPECT_TRUE(::kiln::testing::has_all(message, {__VA_ARGS__})) << body; \
  } while (0)

TEST(GenerationParams, ReadsEveryField) {
  const GenerationParams p = parse_generation_params(R"({
      "model": "flux-tiny-schnell", "prompt": "a red circle", "prompt_2": "for T5", "negative_prompt": "blurry",
      "n": 3, "size": "48x32", "seed": 18446744073709551615, "steps": 7, "guidance": 4.5,
      "max_sequence_length": 16, "response_format": "url"})");
  EXPECT_EQ(p.model, "flux-tiny-schnell");
  EXPECT_EQ(p.prompt, "a red circle");
  EXPECT_EQ(p.prompt_2, "for T5");
  EXPECT_EQ(p.negative_prompt, "blurry");
  EXPECT_EQ(p.n, 3);
  EXPECT_EQ(p.width, 48);
  EXPECT_EQ(p.height, 32);
  EXPECT_EQ(p.seed, 18446744073709551615ull);
  EXPECT_EQ(p.steps, 7);
  EXPECT_EQ(p.guidance, 4.5f);
  EXPECT_EQ(p.max_sequence_length, 16);
  EXPECT_EQ(p.response_format, ResponseFormat::Url);
}

TEST(GenerationParams, UnsetFieldsTakeDefaults) {
  // OpenAI's clients send null for options left unset; "auto" is the model's own size.
  const GenerationParams p =
      parse_generation_params(R"({"prompt": "", "n": null, "seed": null, "size": "auto", "quality": "hd",
                                  "style": "vivid", "user": "u1", "output_format": "png", "stream": false})");
  EXPECT_EQ(p.prompt, "");
  EXPECT_TRUE(p.model.empty());
  EXPECT_EQ(p.n, 1);
  EXPECT_FALSE(p.seed || p.width || p.height || p.steps || p.guidance || p.max_sequence_length);
  EXPECT_EQ(p.response_format, ResponseFormat::B64Json);
}

TEST(GenerationParams, RefusesBodiesThatAreNotOneJsonObject) {
  EXPECT_REFUSED("", "", "not valid JSON");
  EXPECT_REFUSED("{\"prompt\": \"x\"", "", "not valid JSON");
  EXPECT_REFUSED("{\"prompt\": \"x\"} trailing", "", "not valid JSON");
  EXPECT_REFUSED("[1, 2]", "", "expected a JSON object, got an array");
  EXPECT_REFUSED("\"a prompt\"", "", "expected a JSON object, got a string");
  EXPECT_REFUSED(std::string("{\"prompt\": \"\xff\"}"), "", "not valid JSON");  // not UTF-8
  EXPECT_REFUSED(std::string(5000, '[') + std::string(5000, ']'), "", "nests deeper than 8 levels");
  EXPECT_REFUSED(std::string(kMaxRequestBodyBytes + 1, ' '), "", "more than the maximum 1048576");
}

TEST(GenerationParams, RefusesWrongTypesNamingTheField) {
  EXPECT_REFUSED(R"({"model": "m"})", "prompt", "required");
  EXPECT_REFUSED(R"({"prompt": null})", "prompt", "expected a string, got null");
  EXPECT_REFUSED(R"({"prompt": ["a"]})", "prompt", "expected a string, got an array");
  EXPECT_REFUSED(R"({"prompt": "x", "model": 3})", "model", "expected a string, got an integer");
  EXPECT_REFUSED(R"({"prompt": "x", "n": "2"})", "n", "expected an integer from 1 to 64, got a string");
  EXPECT_REFUSED(R"({"prompt": "x", "steps": 2.5})", "steps", "got a number with a fraction");
  EXPECT_REFUSED(R"({"prompt": "x", "seed": -1})", "seed", "from 0 to 2^64-1, got -1");
  EXPECT_REFUSED(R"({"prompt": "x", "seed": 1.0})", "seed", "from 0 to 2^64-1");
  EXPECT_REFUSED(R"({"prompt": "x", "seed": 18446744073709551616})", "seed", "from 0 to 2^64-1");
  EXPECT_REFUSED(R"({"prompt": "x", "guidance": "high"})", "guidance", "expected a number");
  EXPECT_REFUSED(R"({"prompt": "x", "guidance": -1})", "guidance", ">= 0, got -1");
  EXPECT_REFUSED(R"({"prompt": "x", "guidance": 1e300})", "guidance", "finite");
  EXPECT_REFUSED(R"({"prompt": "x", "size": 1024})", "size", "WIDTHxHEIGHT", "got an integer");
  EXPECT_REFUSED(R"({"prompt": "x", "size": "1024*768"})", "size", "got \"1024*768\"");
  EXPECT_REFUSED(R"({"prompt": "x", "size": "x768"})", "size", "WIDTHxHEIGHT");
  EXPECT_REFUSED(R"({"prompt": "x", "size": "99999999999x1"})", "size", "WIDTHxHEIGHT");
  EXPECT_REFUSED(R"({"prompt": "x", "response_format": "png"})", "response_format",
                 "\"b64_json\" or \"url\"");
  EXPECT_REFUSED(R"({"prompt": "x", "output_format": "webp"})", "output_format", "PNG");
  EXPECT_REFUSED(R"({"prompt": "x", "stream": true})", "stream", "/v1/generate");
  EXPECT_REFUSED(R"({"prompt": "x", "sead": 1})", "sead", "unknown field");
  // A field's name is any string: the message quotes and escapes it (a NUL would end the message at once).
  const auto [field, message] = refusal(R"({"prompt": "x", "\u0000se\nad": 1})");
  EXPECT_EQ(field, std::string("\0se\nad", 6));
  EXPECT_EQ(std::string(message.c_str()), message);
  EXPECT_EQ(message.rfind(R"("\u0000se\nad": unknown field)", 0), 0u) << message;
  const std::string long_name(100, 'k');
  EXPECT_TRUE(::kiln::testing::has_all(refusal(R"({"prompt": "x", ")" + long_name + R"(": 1})").second,
                                       {"\"" + std::string(64, 'k') + "\"...: unknown field"}));
  // A string value cut inside a UTF-8 sequence is still valid text in the message.
  const std::string value = std::string(39, 'a') + "\u00e9";
  EXPECT_TRUE(
      ::kiln::testing::has_all(refusal(R"({"prompt": "x", "output_format": ")" + value + R"("})").second,
                               {"got \"" + std::string(39, 'a') + "\ufffd\"..."}));
}

TEST(GenerationParams, AppliesTheLimitsOfTheCommandLine) {
  EXPECT_REFUSED(R"({"prompt": "x", "size": "16385x16"})", "size", "width 16385 exceeds the maximum 16384");
  EXPECT_REFUSED(R"({"prompt": "x", "size": "16x0"})", "size", "height 0 is below the minimum 1");
  EXPECT_REFUSED(R"({"prompt": "x", "steps": 1001})", "steps", "1001 exceeds the maximum 1000");
  EXPECT_REFUSED(R"({"prompt": "x", "steps": 0})", "steps", "below the minimum 1");
  EXPECT_REFUSED(R"({"prompt": "x", "n": 65})", "n", "65 exceeds the maximum 64");
  EXPECT_REFUSED(R"({"prompt": "x", "max_sequence_length": 513})", "max_sequence_length",
                 "exceeds the maximum 512");
  const std::string long_prompt(limits::kMaxPromptBytes + 1, 'a');
  EXPECT_REFUSED("{\"prompt\": \"" + long_prompt + "\"}", "prompt", "65537 bytes", "65536");
  EXPECT_REFUSED("{\"prompt\": \"x\", \"negative_prompt\": \"" + long_prompt + "\"}", "negative_prompt",
                 "65536");
  // At the limits: accepted.
  const GenerationParams p = parse_generation_params("{\"prompt\": \"" + long_prompt.substr(1) +
                                                     R"(", "size": "16384x1", "steps": 1000, "n": 64})");
  EXPECT_EQ(p.width, 16384);
  EXPECT_EQ(p.steps, 1000);
}

TEST(GenerationParams, WritesBackWhatItReads) {
  for (const char* body :
       {R"({"prompt": "caf\u00e9 \ud83d\udc08", "size": "48x32", "seed": 7, "guidance": 0.1, "n": 2})",
        R"({"prompt": "x", "model": "m", "prompt_2": "y", "negative_prompt": "z", "steps": 3,
            "max_sequence_length": 77, "response_format": "url", "true_cfg_scale": 3.7})",
        R"({"prompt": "x", "seed": 18446744073709551615})"}) {
    const GenerationParams p = parse_generation_params(body);
    const GenerationParams q = parse_generation_params(to_json_text(p));
    EXPECT_EQ(q.prompt, p.prompt);
    EXPECT_EQ(q.model, p.model);
    EXPECT_EQ(q.prompt_2, p.prompt_2);
    EXPECT_EQ(q.negative_prompt, p.negative_prompt);
    EXPECT_EQ(q.width, p.width);
    EXPECT_EQ(q.height, p.height);
    EXPECT_EQ(q.seed, p.seed);
    EXPECT_EQ(q.steps, p.steps);
    EXPECT_EQ(q.guidance, p.guidance);  // a float, exactly
    EXPECT_EQ(q.true_cfg_scale, p.true_cfg_scale);
    EXPECT_EQ(q.n, p.n);
    EXPECT_EQ(q.max_sequence_length, p.max_sequence_length);
    EXPECT_EQ(q.response_format, p.response_format);
  }
}

TEST(GenerationParams, BecomeThePipelineRequestOfTheirClass) {
  const GenerationParams p = parse_generation_params(
      R"({"prompt": "x", "prompt_2": "t5", "size": "48x32", "steps": 3, "guidance": 2, "n": 2, "negative_prompt": "n",
          "true_cfg_scale": 4})");
  const PipelineRequest flux = to_pipeline_request(p, "FluxPipeline", 9);
  EXPECT_EQ(flux.prompt_2, "t5");  // FLUX.1: T5's prompt is prompt_2
  EXPECT_FALSE(flux.prompt_3);
  EXPECT_EQ(flux.width, 48);
  EXPECT_EQ(flux.height, 32);
  EXPECT_EQ(flux.num_inference_steps, 3);
  EXPECT_EQ(flux.guidance_scale, 2.0f);
  EXPECT_EQ(flux.num_images_per_prompt, 2);
  EXPECT_EQ(flux.negative_prompt, "n");
  EXPECT_EQ(flux.true_cfg_scale, 4.0f);
  ASSERT_TRUE(flux.generator);
  EXPECT_EQ(flux.generator->initial_seed(), 9u);
  const PipelineRequest sd3 = to_pipeline_request(p, "StableDiffusion3Pipeline", 9);
  EXPECT_EQ(sd3.prompt_3, "t5");  // SD3: T5's prompt is prompt_3, as kiln generate --prompt-2
  EXPECT_FALSE(sd3.prompt_2);
}

TEST(GenerationParams, NameTheJsonFieldOfAPipelineField) {
  EXPECT_EQ(json_field_of("height"), "size");
  EXPECT_EQ(json_field_of("width"), "size");
  EXPECT_EQ(json_field_of("num_inference_steps"), "steps");
  EXPECT_EQ(json_field_of("guidance_scale"), "guidance");
  EXPECT_EQ(json_field_of("num_images_per_prompt"), "n");
  EXPECT_EQ(json_field_of("prompt_3"), "prompt_2");
  EXPECT_EQ(json_field_of("negative_prompt_3"), "negative_prompt");
  EXPECT_EQ(json_field_of("negative_prompt"), "negative_prompt");
  EXPECT_EQ(json_field_of("max_sequence_length"), "max_sequence_length");
}

}  // namespace
}  // namespace kiln::serve
