// A model folder's recommended call (recommended_call.json beside model_index.json): models/kiln-shapes-64
// carries the values it was trained with, so that a call leaving them out makes its 64 x 64 picture rather
// than the family's 1024 x 1024 one; the family's defaults stay what they are; a file Kiln cannot read fails
// the load naming the key, before any weight loads.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kiln/families/flux1/flux_pipeline.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

const std::string kShapes = testing::data_path("../../models/kiln-shapes-64");
const char* kPrompt = "a big white circle on the right, on a black background";

TEST(RecommendedCall, TheShippedModelsCallIsWhatUnsetFieldsTake) {
  auto pipe = DiffusionPipeline::from_pretrained(kShapes);
  ASSERT_TRUE(pipe->recommended_call().has_value());
  EXPECT_EQ(pipe->recommended_call()->describe(), "64x64, 4 steps, guidance 0, 40 tokens");
  EXPECT_NE(pipe->defaults_source().find("recommended_call.json"), std::string::npos);
  const PipelineDefaults d = pipe->defaults(), family = pipe->family_defaults();
  EXPECT_EQ(d.height, 64);
  EXPECT_EQ(d.width, 64);
  EXPECT_EQ(d.num_inference_steps, 4);
  EXPECT_EQ(d.guidance_scale, 0.0f);
  EXPECT_EQ(d.max_sequence_length, 40);
  // FluxPipeline's own are unchanged.
  EXPECT_EQ(family.height, 1024);
  EXPECT_EQ(family.num_inference_steps, 28);
  // A call with only a prompt and a seed: the README's picture, as with the flags written out.
  PipelineRequest bare;
  bare.prompt = kPrompt;
  bare.generator = Generator(0);
  PipelineRequest explicit_call = bare;
  explicit_call.height = explicit_call.width = 64;
  explicit_call.num_inference_steps = 4;
  explicit_call.guidance_scale = 0.0f;
  explicit_call.max_sequence_length = 40;
  explicit_call.generator = Generator(0);
  const Image a = (*pipe)(bare).images.at(0), b = (*pipe)(explicit_call).images.at(0);
  EXPECT_EQ(a.width, 64);
  EXPECT_EQ(a.pixels, b.pixels);
}

TEST(RecommendedCall, AFolderWithoutOneTakesTheFamilysDefaults) {
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-schnell"));
  EXPECT_FALSE(pipe.recommended_call().has_value());
  EXPECT_EQ(pipe.defaults_source(), "the family's defaults (FluxPipeline)");
  EXPECT_EQ(pipe.defaults().num_inference_steps, pipe.family_defaults().num_inference_steps);
}

TEST(RecommendedCall, AFileItCannotReadFailsTheLoadNamingTheKey) {
  const auto refused = [](const std::string& text, const std::string& words) {
    const fs::path folder = fs::path(testing::temp_dir("recommended_call_bad")) / "model";
    fs::remove_all(folder);
    fs::copy(testing::data_path("models/flux-tiny-schnell"), folder, fs::copy_options::recursive);
    std::ofstream(folder / "recommended_call.json") << text;
    try {
      FluxPipeline::from_pretrained(folder.string());
      ADD_FAILURE() << text << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("recommended_call.json"), std::string::npos) << e.what();
    }
  };
  refused(R"({"steps": 4})", "is not a recommended call argument");
  refused(R"({"height": 0})", "expected a number in [1, 16384]");
  refused(R"({"num_inference_steps": 2.5})", "expected a whole number");
  refused(R"({"guidance_scale": "high"})", "expected a number");
  refused("[1, 2]", "");
}

}  // namespace
}  // namespace kiln
