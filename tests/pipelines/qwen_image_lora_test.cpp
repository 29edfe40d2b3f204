// Qwen-Image LoRAs in the layouts they ship in (tools/goldens/qwen_image_lora.py), against diffusers'
// QwenImagePipeline.load_lora_weights on the tiny pipeline: diffusers/PEFT names (transformer.*), kohya's
// (lora_unet_transformer_blocks_0_attn_to_k, lora_unet_norm_out_linear, alpha / rank), the
// diffusion_model.-prefixed lora_A / lora_B with alphas on some modules, and lightx2v's Qwen-Image-Lightning
// style (bare names, lora_down / lora_up / alpha on every block Linear). Each gives diffusers' image within
// one 8-bit level; fused at 0.7, unfused at adapter weight 0.6 and on a Q8_0 GGUF transformer, diffusers'
// images too. Other families' LoRAs are refused naming what does not fit.
#include <gtest/gtest.h>

#include <map>

#include "kiln/families/qwen_image/qwen_image_pipeline.h"
#include "kiln/families/qwen_image/qwen_image_transformer.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::expect_images_match;
using testing::GoldenFile;

QwenImagePipeline tiny() {
  return QwenImagePipeline::from_pretrained(testing::data_path("models/qwen-image-tiny"));
}

class QwenImageLora : public ::testing::TestWithParam<const char*> {};

TEST_P(QwenImageLora, EachLayoutGivesDiffusersImage) {
  const std::string layout = GetParam();
  const GoldenFile base("qwen_image", "cat_64x64_s0"), g("qwen_image_files", "lora_" + layout);
  QwenImagePipeline pipe = tiny();
  const lora::LoraLoadReport report =
      pipe.load_lora_weights(testing::data_path("lora/" + g.meta("lora")), {.adapter_name = "a"});
  EXPECT_TRUE(report.skipped.empty()) << report.describe();
  // The Linear layers diffusers' PEFT wrapped.
  EXPECT_EQ(report.layers.at("transformer"), std::stoll(g.meta("layers"))) << report.describe();
  const std::map<std::string, lora::LoraFormat> formats = {{"diffusers", lora::LoraFormat::Diffusers},
                                                           {"kohya", lora::LoraFormat::Kohya},
                                                           {"comfy", lora::LoraFormat::BlackForestLabs},
                                                           {"lightning", lora::LoraFormat::BlackForestLabs}};
  EXPECT_EQ(report.format, formats.at(layout)) << report.describe();
  expect_images_match(pipe(base.request()), g);
  // Without it, the base image.
  pipe.unload_lora_weights();
  expect_images_match(pipe(base.request()), base);
}

INSTANTIATE_TEST_SUITE_P(Layouts, QwenImageLora,
                         ::testing::Values("diffusers", "kohya", "comfy", "lightning"));

TEST(QwenImageLora, FusedAtAScaleGivesDiffusersFusedImage) {
  const GoldenFile base("qwen_image", "cat_64x64_s0"), g("qwen_image_files", "lora_diffusers_fused_0.7");
  QwenImagePipeline pipe = tiny();
  pipe.load_lora_weights(testing::data_path("lora/" + g.meta("lora")), {.adapter_name = "a"});
  pipe.fuse_lora({.lora_scale = std::stod(g.meta("lora_scale"))});
  const PipelineOutput fused = pipe(base.request());
  expect_images_match(fused, g);
  // Unfused, the adapter keeps the 0.7 it was fused with (as PEFT's scale_layer does): the same image.
  pipe.unfuse_lora();
  EXPECT_LE(testing::max_level_difference(pipe(base.request()).images[0], fused.images[0]), 1);
}

TEST(QwenImageLora, UnfusedAtAnAdapterWeightGivesDiffusersImage) {
  const GoldenFile base("qwen_image", "cat_64x64_s0"), g("qwen_image_files", "lora_kohya_weight_0.6");
  QwenImagePipeline pipe = tiny();
  pipe.load_lora_weights(testing::data_path("lora/" + g.meta("lora")), {.adapter_name = "a"});
  pipe.set_adapters({"a"}, {std::stod(g.meta("adapter_weight"))});
  expect_images_match(pipe(base.request()), g);
}

TEST(QwenImageLora, OnAGgufTransformerGivesDiffusersImage) {
  // The Lightning-style LoRA over the Q8_0 GGUF transformer, unfused: the quantized weights stay quantized.
  const GoldenFile base("qwen_image", "cat_64x64_s0"), g("qwen_image_files", "lora_lightning_gguf_q8_0");
  QwenImagePipeline pipe = QwenImagePipeline::from_pretrained(
      testing::data_path("models/qwen-image-tiny"),
      {.transformer_file = testing::data_path("goldens/qwen_image_files/" + g.meta("transformer_file"))});
  const lora::LoraLoadReport report =
      pipe.load_lora_weights(testing::data_path("lora/" + g.meta("lora")), {.adapter_name = "a"});
  EXPECT_EQ(report.layers.at("transformer"), std::stoll(g.meta("layers"))) << report.describe();
  int quantized = 0;
  for (const auto& [name, t] : pipe.transformer().named_parameters())
    quantized += t->defined() && t->dtype() == uint8;
  EXPECT_EQ(quantized, 2 * 14 + 4);
  expect_images_match(pipe(base.request()), g);
}

TEST(QwenImageLora, AnotherFamilysLoraIsRefusedNamingIt) {
  QwenImagePipeline pipe = tiny();
  // (file, what the message must say)
  const std::pair<const char*, const char*> cases[] = {
      // FLUX.1's original names: modules Qwen-Image does not have.
      {"flux_bfl.safetensors", "not a module of the Qwen-Image transformer"},
      {"flux_kohya.safetensors", "not a module of the Qwen-Image transformer"},
      // Z-Image's (none of them Qwen-Image's: read as diffusion_model.-prefixed diffusers names).
      {"z_image_comfy.safetensors", "the model has no layer transformer.cap_embedder.1"},
      // A layout Qwen-Image's loader does not read.
      {"flux_xlabs.safetensors", "XLabs layout are not for Qwen-Image"},
      // Stable Diffusion's UNet.
      {"sd15_diffusers.safetensors", "is not one Qwen-Image pipelines load LoRA into"},
      // FLUX.1's diffusers names: its single-stream blocks are no layer of Qwen-Image.
      {"flux_diffusers.safetensors", "the model has no layer transformer.context_embedder"},
  };
  for (const auto& [file, expected] : cases) {
    try {
      pipe.load_lora_weights(testing::data_path(std::string("lora/") + file), {.adapter_name = "a"});
      ADD_FAILURE() << file << " was loaded into Qwen-Image";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << file << ": " << e.what();
    }
  }
  EXPECT_TRUE(pipe.get_active_adapters().empty());
}

}  // namespace
}  // namespace kiln
