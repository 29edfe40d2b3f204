// Kiln's images with LoRA adapters against diffusers' (tools/goldens/lora.py): every layout (diffusers/PEFT,
// kohya, Black Forest Labs, XLabs) on FLUX.1, SD3 (transformer and both CLIP encoders) and FLUX.2 [klein],
// two adapters at different weights, fused and unfused, in float32, bfloat16 and on a GGUF Q8_0 transformer.
#include <gtest/gtest.h>

#include "lora/lora_goldens.h"

namespace kiln {
namespace {

using testing::LoraGolden;

// The image diffusers makes without any adapter for this golden's pipeline and call.
std::string no_lora_golden(const std::string& name) {
  return name.substr(0, name.find('_')) == "flux2" ? "flux2_none"
         : name.substr(0, 3) == "sd3"              ? "sd3_none"
                                                   : "flux_none";
}

PipelineOutput run(const LoraGolden& g) {
  auto pipe = g.load();
  g.replay(*pipe);
  return (*pipe)(g.request());
}

class LoraGoldenFloat32 : public ::testing::TestWithParam<const char*> {};

TEST_P(LoraGoldenFloat32, ImageMatchesDiffusers) {
  const LoraGolden g(GetParam());
  const PipelineOutput out = run(g);
  ASSERT_EQ(out.images.size(), 1u);
  EXPECT_GE(testing::share_within_one_level(out.images[0].pixels, g.image()), 0.99);
  // The adapters change the picture: an image that ignored them would fail here.
  const LoraGolden none(no_lora_golden(GetParam()));
  EXPECT_GT(testing::mean_level_difference(out.images[0].pixels, none.image()), 1.5);
}

INSTANTIATE_TEST_SUITE_P(Goldens, LoraGoldenFloat32,
                         ::testing::Values("flux_diffusers", "flux_kohya", "flux_bfl", "flux_xlabs",
                                           "flux_two_adapters", "flux_two_adapters_fused",
                                           "flux_two_adapters_unfused", "flux_second_only", "sd3_diffusers",
                                           "sd3_two_adapters_fused", "flux2_diffusers", "flux2_kohya",
                                           "flux2_bfl", "flux2_two_adapters_fused"));

// bfloat16 (the pipeline and, on the GGUF transformer, its Q8_0 weights expanded to bfloat16): every op
// rounds to 8 significant bits, as diffusers' run does but not always at the same points; the bound is the
// one of the bfloat16 pipeline tests.
class LoraGoldenBfloat16 : public ::testing::TestWithParam<const char*> {};

TEST_P(LoraGoldenBfloat16, ImageMatchesDiffusersWithinBf16Rounding) {
  const LoraGolden g(GetParam());
  ASSERT_EQ(g.dtype, bfloat16);
  const PipelineOutput out = run(g);
  EXPECT_LE(testing::mean_level_difference(out.images[0].pixels, g.image()), 2.0);
  const LoraGolden none("flux_none");
  EXPECT_GT(testing::mean_level_difference(out.images[0].pixels, none.image()), 4.0);
}

INSTANTIATE_TEST_SUITE_P(Goldens, LoraGoldenBfloat16,
                         ::testing::Values("fluxbf16_two_adapters", "fluxbf16_two_adapters_fused",
                                           "fluxq8_two_adapters"));

// Black Forest Labs' names with lora_A / lora_B (the golden was made from the same tensors named lora_down /
// lora_up, ComfyUI's layout, which is the one diffusers converts for FLUX.1).
TEST(LoraGolden, BlackForestLabsLoraAbNamesGiveTheSameImage) {
  const LoraGolden g("flux_bfl");
  auto pipe = g.load();
  const auto report = pipe->load_lora_weights(testing::data_path("lora/flux_bfl.safetensors"));
  EXPECT_EQ(report.format, lora::LoraFormat::BlackForestLabs);
  EXPECT_EQ(report.layers.at("transformer"), 15);
  EXPECT_GE(testing::share_within_one_level((*pipe)(g.request()).images[0].pixels, g.image()), 0.99);
}

// kohya LoRA on img_in, txt_in, time_in, vector_in, guidance_in and the final layer: diffusers 0.42 drops
// these (its converter names them without the transformer. prefix), Kiln applies them as the same pairs
// written in diffusers' names by hand (alpha folded in, the final adaLN's (shift, scale) halves swapped) are
// applied.
TEST(LoraGolden, KohyaLayersOutsideTheBlocksEqualTheirDiffusersNames) {
  const LoraGolden g("flux_none");
  auto kohya = g.load();
  const auto report = kohya->load_lora_weights(testing::data_path("lora/flux_kohya_globals.safetensors"));
  EXPECT_EQ(report.format, lora::LoraFormat::Kohya);
  EXPECT_EQ(report.layers.at("transformer"), 7);
  auto diffusers = g.load();
  diffusers->load_lora_weights(testing::data_path("lora/flux_kohya_globals_as_diffusers.safetensors"));
  const auto a = (*kohya)(g.request()).images[0].pixels;
  const auto b = (*diffusers)(g.request()).images[0].pixels;
  int64_t far = 0;
  for (size_t i = 0; i < a.size(); ++i) far += std::abs(int(a[i]) - int(b[i])) > 1;
  EXPECT_EQ(far, 0);
  EXPECT_GT(testing::mean_level_difference(a, g.image()), 1.5);
}

}  // namespace
}  // namespace kiln
