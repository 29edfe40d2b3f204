// Z-Image LoRAs in the layouts they ship in (tools/goldens/z_image_files.py), against diffusers'
// pipe.load_lora_weights: diffusers/PEFT names, kohya's (lora_unet_layers_0_attention_qkv: a fused qkv split
// over to_q, to_k and to_v, alpha / rank), and the original names ComfyUI-trained files carry
// (diffusion_model.layers.1. attention.out). Each gives diffusers' image within one 8-bit level; fused at
// 0.7, diffusers' fused image.
#include <gtest/gtest.h>

#include <map>

#include "kiln/families/z_image/z_image_pipeline.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::GoldenFile;

ZImagePipeline tiny() {
  return ZImagePipeline::from_pretrained(testing::data_path("models/z-image-tiny"));
}

void expect_golden(const PipelineOutput& out, const GoldenFile& g, const std::string& what) {
  ASSERT_EQ(out.images.size(), 1u);
  EXPECT_GE(testing::share_within_one_level(out.images[0].pixels, g["image_u8"].select(0, 0)), 0.99) << what;
}

class ZImageLora : public ::testing::TestWithParam<const char*> {};

TEST_P(ZImageLora, EachLayoutGivesDiffusersImage) {
  const std::string layout = GetParam();
  const GoldenFile base("z_image", "turbo_cat_64x64_s0"), g("z_image", "lora_" + layout);
  ZImagePipeline pipe = tiny();
  const lora::LoraLoadReport report = pipe.load_lora_weights(
      testing::data_path("lora/z_image_" + layout + ".safetensors"), {.adapter_name = "a"});
  EXPECT_TRUE(report.skipped.empty()) << layout;
  // The layers diffusers reaches: 10 modules; kohya's 9 with three fused qkv, 15; the original names', 7.
  const std::map<std::string, int64_t> layers = {{"diffusers", 10}, {"kohya", 15}, {"comfy", 7}};
  EXPECT_EQ(report.layers.at("transformer"), layers.at(layout)) << report.describe();
  expect_golden(pipe(base.request()), g, layout);
  // Without it, the base image.
  pipe.unload_lora_weights();
  expect_golden(pipe(base.request()), base, layout + " unloaded");
}

INSTANTIATE_TEST_SUITE_P(Layouts, ZImageLora, ::testing::Values("diffusers", "kohya", "comfy"));

TEST(ZImageLora, FusedAtAScaleGivesDiffusersFusedImage) {
  const GoldenFile base("z_image", "turbo_cat_64x64_s0"), g("z_image", "lora_diffusers_fused_0.7");
  ZImagePipeline pipe = tiny();
  pipe.load_lora_weights(testing::data_path("lora/z_image_diffusers.safetensors"), {.adapter_name = "a"});
  pipe.fuse_lora({.lora_scale = 0.7});
  const PipelineOutput fused = pipe(base.request());
  expect_golden(fused, g, "fused at 0.7");
  // Unfused, the adapter keeps the 0.7 it was fused with (as PEFT's scale_layer does): the same image.
  pipe.unfuse_lora();
  EXPECT_LE(testing::max_level_difference(pipe(base.request()).images[0], fused.images[0]), 1);
}

TEST(ZImageLora, AnotherFamilysLoraIsRefusedNamingIt) {
  ZImagePipeline pipe = tiny();
  try {
    pipe.load_lora_weights(testing::data_path("lora/chroma_diffusers.safetensors"), {.adapter_name = "a"});
    ADD_FAILURE() << "a Chroma LoRA was loaded into Z-Image";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the model has no layer transformer."), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
