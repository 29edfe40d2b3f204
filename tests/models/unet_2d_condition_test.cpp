// UNet2DConditionModel against diffusers 0.42 on the first UNet call of tools/goldens/sd.py's pipelines
// (diffusers' own inputs): SD1.x's 1x1-conv projections and legacy head count, SDXL's linear projections,
// per-block heads and transformer depths and added conditions, a size whose latents are odd at the deeper
// levels (diffusers' upsample_size path). And the configs it refuses, by name.
#include <gtest/gtest.h>

#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/io/safetensors.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct Case {
  const char* golden;
  const char* model;
};

class UNetMatchesDiffusers : public ::testing::TestWithParam<Case> {};

TEST_P(UNetMatchesDiffusers, OnItsFirstCall) {
  const Case c = GetParam();
  const io::SafetensorsFile g(testing::data_path(std::string("goldens/sd/") + c.golden + ".safetensors"));
  const auto unet =
      models::load_unet_2d_condition(testing::data_path(std::string("models/") + c.model + "/unet"), float32);
  models::UNetAddedConditions added;
  if (g.contains("add_time_ids"))
    added = {.text_embeds = g.tensor("unet_text_embeds_step0"),
             .time_ids = g.tensor("add_time_ids").to(float32)};
  const auto trace = unet->forward_traced(g.tensor("unet_in_step0"), g.tensor("unet_t_step0").to(float32),
                                          g.tensor("unet_encoder_hidden_states_step0"), added);
  EXPECT_TRUE(testing::rel_max_error_within(trace.temb, g.tensor("temb_step0"), 1e-5)) << c.golden;
  for (size_t i = 0; g.contains("down_block_res_samples_step0_" + std::to_string(i)); ++i)
    EXPECT_TRUE(testing::rel_max_error_within(trace.down_block_res_samples.at(i),
                                              g.tensor("down_block_res_samples_step0_" + std::to_string(i)),
                                              1e-4))
        << c.golden << " skip " << i;
  if (g.contains("mid_block_out_step0")) {
    EXPECT_TRUE(testing::rel_max_error_within(trace.mid_block_out, g.tensor("mid_block_out_step0"), 1e-4))
        << c.golden;
  }
  EXPECT_TRUE(testing::rel_max_error_within(trace.out, g.tensor("unet_out_step0"), 1e-4)) << c.golden;
}

INSTANTIATE_TEST_SUITE_P(Goldens, UNetMatchesDiffusers,
                         ::testing::Values(Case{"sd15_cat_64x64_s0", "sd15-tiny"},
                                           Case{"sd15_nocfg_32x48_s3", "sd15-tiny"},
                                           Case{"sd15_oddlatent_36x28_s5", "sd15-tiny"},
                                           Case{"sdxl_cat_64x64_s0", "sdxl-tiny"},
                                           Case{"sdxl_empty_negative_32x32_s2", "sdxl-tiny"},
                                           Case{"sdxl_micro_cond_32x48_s3", "sdxl-tiny"}));

void expect_refused(const std::string& json, const std::string& words) {
  try {
    models::UNet2DConditionConfig::from_json(json, "unet/config.json");
    ADD_FAILURE() << "accepted: " << json;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(UNet2DConditionConfig, RefusesWhatItDoesNotRunByName) {
  expect_refused(R"({"_class_name": "UNet2DModel"})", "not a Stable Diffusion UNet config");
  expect_refused(R"({"time_cond_proj_dim": 256})", "LCM-distilled");
  expect_refused(R"({"class_embed_type": "projection"})", "class embeddings");
  expect_refused(R"({"encoder_hid_dim_type": "image_proj"})", "encoder_hid_proj");
  expect_refused(R"({"addition_embed_type": "text_image"})", "text_time");
  expect_refused(R"({"down_block_types": ["SimpleCrossAttnDownBlock2D", "DownBlock2D"],
                     "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "block_out_channels": [32, 64]})",
                 "SimpleCrossAttnDownBlock2D");
  expect_refused(R"({"block_out_channels": [32, 64]})", "same length");
  expect_refused(R"({"attention_head_dim": 7})", "not divisible into 7 attention heads");
  expect_refused(R"({"some_new_argument": 1})", "some_new_argument");
}

TEST(UNet2DConditionConfig, ReadsTheLegacyHeadCountAndPerBlockValues) {
  // SD1.5's config: attention_head_dim 8 is eight heads per block; SDXL's lists are per block.
  const auto sd =
      models::UNet2DConditionConfig::from_json(R"({"attention_head_dim": 8, "layers_per_block": 2})");
  EXPECT_EQ(sd.num_attention_heads, (std::vector<int64_t>{8, 8, 8, 8}));
  EXPECT_EQ(sd.layers_per_block, (std::vector<int64_t>{2, 2, 2, 2}));
  const auto xl = models::UNet2DConditionConfig::from_json(R"({
      "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
      "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
      "block_out_channels": [320, 640, 1280], "attention_head_dim": [5, 10, 20],
      "transformer_layers_per_block": [1, 2, 10], "addition_embed_type": "text_time",
      "addition_time_embed_dim": 256, "projection_class_embeddings_input_dim": 2816,
      "cross_attention_dim": 2048, "use_linear_projection": true})");
  EXPECT_EQ(xl.num_attention_heads, (std::vector<int64_t>{5, 10, 20}));
  EXPECT_EQ(xl.transformer_layers_per_block, (std::vector<int64_t>{1, 2, 10}));
  EXPECT_TRUE(xl.text_time());
  EXPECT_EQ(xl.time_embed_dim(), 1280);
}

// Tensor parallelism splits the attention heads: a degree that does not divide a block's heads (SD1.5-tiny's
// 4) is refused by name when the model is built, before any weight is read. (Two ranks:
// tests/dist/tensor_parallel_stable_diffusion_test.cpp.)
TEST(UNet2DConditionModel, RefusesATensorParallelDegreeThatDoesNotDivideTheHeads) {
  const auto config =
      models::UNet2DConditionConfig::from_file(testing::data_path("models/sd15-tiny/unet/config.json"));
  try {
    models::UNet2DConditionModel model(config, {.rank = 0, .size = 3});
    ADD_FAILURE() << "3 ranks were taken for 4 heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention heads at 16 channels (4) is not divisible by "
                                         "the tensor-parallel degree 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(models::UNet2DConditionModel(config, {.rank = 1, .size = 2}));
}

}  // namespace
}  // namespace kiln
