// kiln serve's request bodies: every field read, every bad value refused with a RequestError naming its JSON
// field, the CLI's limits, and the way back to JSON and on to a pipeline request.
#include "cli/serve/generation_params.h"

#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "kiln/core/limits.h"
#include "kiln/pipelines/request_fields.h"

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

// A served field's value as text (the served kinds: texts, numbers, booleans, integer lists).
std::string plain(const FieldValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>)
          return v;
        else if constexpr (std::is_same_v<V, int64_t> || std::is_same_v<V, bool>)
          return std::to_string(v);
        else if constexpr (std::is_same_v<V, double>) {
          char buf[40];
          std::snprintf(buf, sizeof buf, "%.17g", v);
          return buf;
        } else if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
          std::string s;
          for (int64_t x : v) s += std::to_string(x) + ",";
          return s;
        } else {
          return "(not served)";
        }
      },
      value);
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
  const PipelineRequest& r = p.request;
  EXPECT_EQ(p.model, "flux-tiny-schnell");
  EXPECT_EQ(r.prompt, "a red circle");
  EXPECT_EQ(r.prompt_2, "for T5");
  EXPECT_EQ(r.negative_prompt, "blurry");
  EXPECT_EQ(r.num_images_per_prompt, 3);
  EXPECT_EQ(r.width, 48);
  EXPECT_EQ(r.height, 32);
  EXPECT_EQ(p.seed(), 18446744073709551615ull);
  EXPECT_EQ(r.num_inference_steps, 7);
  EXPECT_EQ(r.guidance_scale, 4.5f);
  EXPECT_EQ(r.max_sequence_length, 16);
  EXPECT_EQ(p.response_format, ResponseFormat::Url);
}

TEST(GenerationParams, UnsetFieldsTakeDefaults) {
  // OpenAI's clients send null for options left unset; "auto" is the model's own size.
  const GenerationParams p =
      parse_generation_params(R"({"prompt": "", "n": null, "seed": null, "size": "auto", "quality": "hd",
                                  "style": "vivid", "user": "u1", "output_format": "png", "stream": false})");
  const PipelineRequest& r = p.request;
  EXPECT_EQ(r.prompt, "");
  EXPECT_TRUE(p.model.empty());
  EXPECT_EQ(r.num_images_per_prompt, 1);
  EXPECT_FALSE(p.seed() || r.width || r.height || r.num_inference_steps || r.guidance_scale ||
               r.max_sequence_length);
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
  EXPECT_REFUSED(std::string(kMaxRequestBodyBytes + 1, ' '), "", "more than the maximum 50331648");
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
  EXPECT_EQ(p.request.width, 16384);
  EXPECT_EQ(p.request.num_inference_steps, 1000);
}

TEST(GenerationParams, WritesBackWhatItReads) {
  for (const char* body :
       {R"({"prompt": "caf\u00e9 \ud83d\udc08", "size": "48x32", "seed": 7, "guidance": 0.1, "n": 2})",
        R"({"prompt": "x", "model": "m", "prompt_2": "y", "negative_prompt": "z", "steps": 3,
            "max_sequence_length": 77, "response_format": "url", "true_cfg_scale": 3.7})",
        R"({"prompt": "x", "seed": 18446744073709551615})"}) {
    const GenerationParams p = parse_generation_params(body);
    const GenerationParams q = parse_generation_params(to_json_text(p));
    EXPECT_EQ(q.model, p.model);
    EXPECT_EQ(q.seed(), p.seed());
    EXPECT_EQ(q.response_format, p.response_format);
    // Every field of the request the body set, by the one declaration (floats exactly).
    for (const RequestField& f : request_fields()) {
      EXPECT_EQ(f.is_set(q.request), f.is_set(p.request)) << f.name << " in " << body;
      if (!f.is_set(p.request) || f.kind == FieldKind::Generator) continue;
      EXPECT_EQ(plain(f.get(q.request)), plain(f.get(p.request))) << f.name << " in " << body;
    }
  }
}

TEST(GenerationParams, BecomeThePipelineRequest) {
  // diffusers' names mean what they mean in diffusers: prompt_2 is FLUX.1's T5 prompt and SD3's CLIP-G one,
  // prompt_3 SD3's T5 prompt; which a class takes is its own declaration (PipelineClass::fields).
  const GenerationParams p = parse_generation_params(
      R"({"prompt": "x", "prompt_2": "t5", "prompt_3": "t5 too", "size": "48x32", "steps": 3, "guidance": 2,
          "n": 2, "negative_prompt": "n", "true_cfg_scale": 4, "strength": 0.5, "skip_guidance_layers": [7, 8]})");
  const PipelineRequest r = to_pipeline_request(p, 9);
  EXPECT_EQ(r.prompt_2, "t5");
  EXPECT_EQ(r.prompt_3, "t5 too");
  EXPECT_EQ(r.width, 48);
  EXPECT_EQ(r.height, 32);
  EXPECT_EQ(r.num_inference_steps, 3);
  EXPECT_EQ(r.guidance_scale, 2.0f);
  EXPECT_EQ(r.num_images_per_prompt, 2);
  EXPECT_EQ(r.negative_prompt, "n");
  EXPECT_EQ(r.true_cfg_scale, 4.0f);
  EXPECT_EQ(r.strength, 0.5);
  EXPECT_EQ(r.skip_layer_guidance.layers, (std::vector<int64_t>{7, 8}));
  ASSERT_TRUE(r.generator);
  EXPECT_EQ(r.generator->initial_seed(), 9u);
}

TEST(GenerationParams, ReadEveryServedFieldByItsKind) {
  EXPECT_REFUSED(R"({"prompt": "x", "strength": 1.5})", "strength", "in [0, 1], got 1.5");
  EXPECT_REFUSED(R"({"prompt": "x", "skip_guidance_layers": 7})", "skip_guidance_layers",
                 "a list of integers");
  EXPECT_REFUSED(R"({"prompt": "x", "skip_guidance_layers": [7, -1]})", "skip_guidance_layers",
                 "below the minimum 0");
  EXPECT_REFUSED(R"({"prompt": "x", "auto_resize": "yes"})", "auto_resize", "expected true or false");
  EXPECT_EQ(parse_generation_params(R"({"prompt": "x", "auto_resize": false})").request.auto_resize, false);
  // Every field with a JSON name is read, and no other.
  for (const RequestField& f : request_fields()) {
    if (f.json.empty() || f.json == "prompt") continue;
    const auto [field, message] = refusal(R"({"prompt": "x", ")" + f.json + R"(": {}})");
    EXPECT_EQ(field, f.json) << message;
    EXPECT_EQ(message.find("unknown field"), std::string::npos) << message;
  }
  EXPECT_REFUSED(R"({"prompt": "x", "prompt_embeds": [1]})", "prompt_embeds", "unknown field");
}

TEST(GenerationParams, NameTheJsonFieldOfAPipelineField) {
  EXPECT_EQ(json_field_of("height"), "size");
  EXPECT_EQ(json_field_of("width"), "size");
  EXPECT_EQ(json_field_of("num_inference_steps"), "steps");
  EXPECT_EQ(json_field_of("guidance_scale"), "guidance");
  EXPECT_EQ(json_field_of("num_images_per_prompt"), "n");
  EXPECT_EQ(json_field_of("prompt_3"), "prompt_3");
  EXPECT_EQ(json_field_of("generator"), "seed");
  EXPECT_EQ(json_field_of("negative_prompt"), "negative_prompt");
  EXPECT_EQ(json_field_of("max_sequence_length"), "max_sequence_length");
}

}  // namespace
}  // namespace kiln::serve
