// AUTOMATIC1111's txt2img bodies as Kiln's generation requests: the fields that map, the front-ends' defaults
// for what Kiln does not do taken, anything else refused naming the A1111 field.
#include "cli/serve/a1111_params.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/serve/generation_params.h"
#include "kiln/core/error.h"

namespace kiln::serve {
namespace {

using nlohmann::json;

std::string refused_field(const std::string& body) {
  try {
    a1111_txt2img_body(body);
  } catch (const RequestError& e) {
    return e.field();
  }
  ADD_FAILURE() << "accepted: " << body;
  return "";
}

TEST(A1111Params, TheFieldsThatMapBecomeKilnsRequest) {
  const json out =
      json::parse(a1111_txt2img_body(R"({"prompt": "a cat", "negative_prompt": "blurry", "steps": 4,
      "cfg_scale": 0, "width": 64, "height": 48, "seed": 7, "batch_size": 2, "sampler_name": "Euler",
      "override_settings": {"sd_model_checkpoint": "kiln-shapes-64"}})"));
  EXPECT_EQ(out, json::parse(R"({"prompt": "a cat", "negative_prompt": "blurry", "steps": 4, "guidance": 0,
      "size": "64x48", "seed": 7, "n": 2, "model": "kiln-shapes-64", "response_format": "b64_json"})"));
  // And Kiln reads it back: the same call.
  const GenerationParams p = parse_generation_params(out.dump());
  EXPECT_EQ(*p.request.height, 48);
  EXPECT_EQ(p.request.num_images_per_prompt, 2);
  EXPECT_EQ(*p.seed(), 7u);
  EXPECT_EQ(p.model, "kiln-shapes-64");
}

TEST(A1111Params, FrontEndDefaultsAreTakenAndASeedOfMinusOneIsRandom) {
  // What a front-end sends for a plain txt2img, with everything it does not use at A1111's defaults.
  const json out = json::parse(a1111_txt2img_body(R"({"prompt": "a cat", "negative_prompt": "", "seed": -1,
      "subseed": -1, "subseed_strength": 0, "styles": [], "n_iter": 1, "restore_faces": false, "tiling": false,
      "enable_hr": false, "hr_scale": 2, "denoising_strength": 0, "eta": 0, "s_noise": 1, "sampler_index": "Euler",
      "scheduler": "Automatic", "override_settings": {}, "override_settings_restore_afterwards": true,
      "script_args": [], "send_images": true, "save_images": false, "alwayson_scripts": {}})"));
  EXPECT_EQ(out, json::parse(R"({"prompt": "a cat", "response_format": "b64_json"})"));
}

TEST(A1111Params, WhatKilnDoesNotDoIsRefusedByName) {
  EXPECT_EQ(refused_field(R"({"prompt": "a", "enable_hr": true})"), "enable_hr");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "n_iter": 3})"), "n_iter");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "restore_faces": true})"), "restore_faces");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "sampler_name": "DPM++ 2M Karras"})"), "sampler_name");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "script_name": "x/y/z plot"})"), "script_name");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "override_settings": {"CLIP_stop_at_last_layers": 2}})"),
            "override_settings");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "init_images": ["..."]})"), "init_images");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "width": 64.5})"), "width");
  EXPECT_EQ(refused_field(R"({"negative_prompt": "a"})"), "prompt");
  EXPECT_EQ(refused_field("[1, 2]"), "");
  EXPECT_EQ(refused_field("{\"prompt\": "), "");
  EXPECT_EQ(refused_field(std::string(20, '[') + std::string(20, ']')), "");
}

}  // namespace
}  // namespace kiln::serve
