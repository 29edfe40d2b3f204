// AutoencoderKLQwenImage against diffusers 0.42.1 on a tiny random model (tools/goldens/qwen_image_vae.py):
// encode's posterior, decode (with its clamp), the pipelines' latent normalisation, in float32 and bfloat16;
// and what it refuses: several frames, sizes the encoder cannot take, incomplete checkpoints, configs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "kiln/families/qwen_image/autoencoder_kl_qwen_image.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops.h"
#include "support/layout_source.h"
#include "support/test_data.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string model_dir() {
  return testing::data_path("models/qwen-image-vae-tiny");
}

io::SafetensorsFile golden(const char* name) {
  return io::SafetensorsFile(
      testing::data_path(std::string("goldens/qwen_image_vae/") + name + ".safetensors"));
}

void expect_error(const std::function<void()>& run, const std::string& words) {
  try {
    run();
    ADD_FAILURE() << "no error; expected one containing '" << words << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(QwenImageVae, ReadsItsConfig) {
  const auto vae = models::load_autoencoder_kl_qwen_image(model_dir(), float32);
  const auto& c = vae->config();
  EXPECT_EQ(c.base_dim, 4);
  EXPECT_EQ(c.z_dim, 4);
  EXPECT_EQ(c.dim_mult, (std::vector<int64_t>{1, 2, 3, 2}));
  EXPECT_EQ(c.temperal_downsample, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.scale_factor(), 8);
  EXPECT_EQ(vae->pixels_per_latent(), 8);
  EXPECT_EQ(vae->latent_shape(2, 32, 48), (Shape{2, 4, 4, 6}));
  // A config that leaves values out gets diffusers' defaults, which are Qwen-Image's.
  const auto real =
      models::AutoencoderKLQwenImageConfig::from_json(R"({"_class_name": "AutoencoderKLQwenImage"})");
  EXPECT_EQ(real.scale_factor(), 8);
  EXPECT_EQ(real.latents_mean.size(), 16u);
  EXPECT_DOUBLE_EQ(real.latents_std.back(), 1.9160);
}

// float32 end to end: torch and oneDNN sum the convolutions' products in different orders (~1e-7 relative
// each). Observed: the posterior within 5.5e-7 of its largest value; the decode within 3.1e-5 at its worst
// pixel (the decoder is deeper and its conv_out is scaled up 8x, which amplifies the noise). 1e-4 of the
// largest value is the bound for both: a dropped gamma or bias, or a wrong kernel slice, moves the outputs
// by far more (each gamma is drawn from [0.5, 1.5), each bias from torch's default init).
TEST(QwenImageVae, EncodeMatchesDiffusersFloat32) {
  const auto g = golden("f32");
  const auto vae = models::load_autoencoder_kl_qwen_image(model_dir(), float32);
  const auto dist = vae->encode(g.tensor("image"));
  EXPECT_TRUE(testing::rel_max_error_within(dist.mean, g.tensor("mean"), 1e-4));
  EXPECT_TRUE(testing::rel_max_error_within(dist.logvar, g.tensor("logvar"), 1e-4));
  // diffusers' [B, C, 1, H, W] is taken as well.
  const auto framed = vae->encode(g.tensor("image").unsqueeze(2));
  EXPECT_TRUE(testing::rel_max_error_within(framed.mean, g.tensor("mean"), 1e-4));
}

TEST(QwenImageVae, DecodeMatchesDiffusersFloat32AndClamps) {
  const auto g = golden("f32");
  const auto vae = models::load_autoencoder_kl_qwen_image(model_dir(), float32);
  const Tensor image = vae->decode(g.tensor("z"));
  EXPECT_EQ(image.shape(), (Shape{2, 3, 32, 48}));
  // The golden's decoder output exceeds [-1, 1] in part (the script checks), so the clamp is exercised.
  EXPECT_TRUE(testing::rel_max_error_within(image, g.tensor("decoded"), 1e-4));
}

TEST(QwenImageVae, NormalisesLatentsAsThePipelines) {
  for (const char* name : {"f32", "bf16"}) {
    const auto g = golden(name);
    const auto vae = models::load_autoencoder_kl_qwen_image(model_dir(), float32);
    // Elementwise with the same roundings as torch (the statistics rounded to the latents' dtype first):
    // exact.
    EXPECT_TRUE(testing::all_close(vae->to_latents(g.tensor("mean")), g.tensor("to_latents"), 0, 0)) << name;
    EXPECT_TRUE(testing::all_close(vae->from_latents(g.tensor("z")), g.tensor("from_latents"), 0, 0)) << name;
  }
}

double mean_abs_diff(const Tensor& a, const Tensor& b) {
  return mean(abs(sub(a.to(float32), b.to(float32)))).item();
}

// bfloat16 rounds every conv and norm output to 8 significant bits, at points that differ from torch's
// kernels (oneDNN rounds each conv once from float32). The encoder's outputs stay within one bfloat16 step
// of torch's (observed 2.8e-3 of the largest value; 1e-2 is the bound). The tiny decoder's conv_out is
// scaled up (so that the clamp acts), which amplifies that noise: torch's own bfloat16 decode lies up to
// 0.46 (mean 0.021) from the float32 decode of the same latents, so Kiln's bfloat16 decode is held to
// torch's noise instead: its mean distance to the float32 result at most 1.25x torch's, its largest distance
// to torch's bfloat16 result under torch's own largest distance to float32.
TEST(QwenImageVae, Bfloat16StaysWithinRounding) {
  const auto g = golden("bf16");
  const auto vae = models::load_autoencoder_kl_qwen_image(model_dir(), bfloat16);
  const Tensor image = vae->decode(g.tensor("z"));
  EXPECT_EQ(image.dtype(), bfloat16);
  const Tensor reference = g.tensor("decoded_f32"), torch_bf16 = g.tensor("decoded");
  const double torch_noise = mean_abs_diff(torch_bf16, reference);
  EXPECT_LE(mean_abs_diff(image, reference), 1.25 * torch_noise) << "torch's: " << torch_noise;
  const double torch_worst = max(abs(sub(torch_bf16.to(float32), reference))).item();
  EXPECT_TRUE(testing::rel_max_error_within(image, torch_bf16, torch_worst));
  const auto dist = vae->encode(g.tensor("image"));
  EXPECT_EQ(dist.mean.dtype(), bfloat16);
  EXPECT_TRUE(testing::rel_max_error_within(dist.mean, g.tensor("mean"), 1e-2));
  EXPECT_TRUE(testing::rel_max_error_within(dist.logvar, g.tensor("logvar"), 1e-2));
}

TEST(QwenImageVae, RefusesSeveralFramesAndSizesItCannotTake) {
  const auto vae = models::load_autoencoder_kl_qwen_image(model_dir(), float32);
  expect_error([&] { vae->encode(Tensor::zeros({1, 3, 2, 32, 32})); }, "single images only (T = 1)");
  expect_error([&] { vae->decode(Tensor::zeros({1, 4, 3, 4, 4})); }, "single images only (T = 1)");
  expect_error([&] { vae->encode(Tensor::zeros({1, 3, 36, 32})); }, "is not a multiple of 8");
  expect_error([&] { vae->encode(Tensor::zeros({1, 4, 32, 32})); }, "expected [B, 3, H, W]");
  expect_error([&] { vae->decode(Tensor::zeros({1, 16, 4, 4})); }, "expected [B, 4, H, W]");
  expect_error([&] { vae->to_latents(Tensor::zeros({1, 3, 4, 4})); }, "expected latents [B, 4, h, w]");
}

// diffusers' enable_tiling(24, 24, 16, 16) on the 32x48 image and its 4x6 latents: 2x3 tiles each way,
// blended in place with their upper and left neighbours. Same float32 tolerances as untiled; the tiled decode
// is not clamped, as in diffusers.
TEST(QwenImageVae, TiledMatchesDiffusersFloat32) {
  const auto g = golden("f32");
  const auto t = golden("tiled");
  auto vae = models::load_autoencoder_kl_qwen_image(model_dir(), float32);
  vae->enable_tiling({.tile_sample_min_height = 24,
                      .tile_sample_min_width = 24,
                      .tile_sample_stride_height = 16,
                      .tile_sample_stride_width = 16});
  const auto dist = vae->encode(g.tensor("image"));
  EXPECT_TRUE(testing::rel_max_error_within(dist.mean, t.tensor("mean"), 1e-4));
  EXPECT_TRUE(testing::rel_max_error_within(dist.logvar, t.tensor("logvar"), 1e-4));
  const Tensor image = vae->decode(g.tensor("z"));
  EXPECT_GT(max(abs(image)).item(), 1.0);
  EXPECT_TRUE(testing::rel_max_error_within(image, t.tensor("decoded"), 1e-4));
  // Inputs that fit in one tile run whole (and the decode is clamped again).
  vae->enable_tiling();
  EXPECT_TRUE(testing::rel_max_error_within(vae->decode(g.tensor("z")), g.tensor("decoded"), 1e-4));
  vae->set_tiling(std::nullopt);
  EXPECT_FALSE(vae->tiling().has_value());
}

TEST(QwenImageVae, SetTilingTakesDiffusersProportions) {
  auto vae = models::load_autoencoder_kl_qwen_image(model_dir(), float32);
  vae->set_tiling(0);
  ASSERT_TRUE(vae->tiling().has_value());
  EXPECT_EQ(vae->tiling()->tile_sample_min_height, 256);
  EXPECT_EQ(vae->tiling()->tile_sample_stride_width, 192);
  vae->set_tiling(512);
  EXPECT_EQ(vae->tiling()->tile_sample_min_width, 512);
  EXPECT_EQ(vae->tiling()->tile_sample_stride_height, 384);
  expect_error([&] { vae->set_tiling(8); }, "tile_sample_stride_height 0 is not a positive multiple of 8");
  expect_error([&] { vae->set_tiling(100); }, "tile_sample_min_height 100 is not a positive multiple of 8");
  expect_error([&] { vae->enable_tiling({.tile_sample_stride_width = 264}); },
               "(the tiles would leave gaps)");
}

// The real Qwen-Image VAE (tools/goldens/qwen_image_vae.py recorded its names and shapes on the meta device):
// the model built from its config has exactly those tensors and loads strictly from them. Registering
// parameters allocates nothing and the layout source broadcasts one element, so this costs no memory.
TEST(QwenImageVae, TheRealModelHasDiffusersNamesAndShapes) {
  std::ifstream in(testing::data_path("goldens/qwen_image_vae/real_layout.json"));
  const nlohmann::json layout = nlohmann::json::parse(in);
  const auto config = models::AutoencoderKLQwenImageConfig::from_json(layout["config"].dump());
  EXPECT_EQ(config.scale_factor(), 8);
  models::AutoencoderKLQwenImage vae(config);
  std::map<std::string, Shape> mine, want;
  for (const auto& [name, shape] : vae.parameter_shapes()) mine[name] = shape;
  for (const auto& [name, shape] : layout["vae"].items()) want[name] = shape.get<Shape>();
  EXPECT_EQ(mine, want);
  nn::LoadOptions options;
  options.dtype = bfloat16;
  EXPECT_NO_THROW(vae.load_weights(testing::LayoutSource(want, bfloat16), options));
  EXPECT_EQ(vae.latent_shape(1, 1024, 768), (Shape{1, 16, 128, 96}));
}

// A copy of the tiny folder whose checkpoint is changed by `edit` (tensor name -> tensor).
std::string corrupted_copy(const std::string& name,
                           const std::function<void(std::map<std::string, Tensor>&)>& edit) {
  const std::string dir = testing::temp_dir(name);
  fs::copy_file(model_dir() + "/config.json", dir + "/config.json");
  const io::SafetensorsFile src(model_dir() + "/diffusion_pytorch_model.safetensors");
  std::map<std::string, Tensor> tensors;
  for (const auto& n : src.names()) tensors[n] = src.tensor(n);
  edit(tensors);
  io::save_safetensors(dir + "/diffusion_pytorch_model.safetensors", {tensors.begin(), tensors.end()});
  return dir;
}

TEST(QwenImageVae, LoadingIsStrictAndNamesTheTensor) {
  const std::string missing = corrupted_copy(
      "qvae_missing", [](auto& t) { t.erase("decoder.up_blocks.1.upsamplers.0.time_conv.weight"); });
  expect_error([&] { models::load_autoencoder_kl_qwen_image(missing, float32); },
               "decoder.up_blocks.1.upsamplers.0.time_conv.weight");
  const std::string reshaped = corrupted_copy("qvae_shape", [](auto& t) {
    t["encoder.down_blocks.3.norm1.gamma"] = Tensor::zeros({4, 1, 1});
  });
  expect_error([&] { models::load_autoencoder_kl_qwen_image(reshaped, float32); },
               "encoder.down_blocks.3.norm1.gamma");
  const std::string extra = corrupted_copy("qvae_extra", [](auto& t) {
    t["encoder.norm_out.bias"] = Tensor::zeros({8, 1, 1, 1});
  });
  expect_error([&] { models::load_autoencoder_kl_qwen_image(extra, float32); }, "encoder.norm_out.bias");
}

TEST(QwenImageVae, RefusesConfigsItDoesNotRunByName) {
  using models::AutoencoderKLQwenImageConfig;
  expect_error([] { AutoencoderKLQwenImageConfig::from_json(R"({"_class_name": "AutoencoderKLWan"})"); },
               "expected \"AutoencoderKLQwenImage\"");
  expect_error([] { AutoencoderKLQwenImageConfig::from_json(R"({"attn_scales": [0.5]})"); }, "attn_scales");
  expect_error([] { AutoencoderKLQwenImageConfig::from_json(R"({"temperal_downsample": [true, true]})"); },
               "temperal_downsample has 2 entries");
  expect_error([] { AutoencoderKLQwenImageConfig::from_json(R"({"temperal_downsample": [1, 0, 0]})"); },
               "expected a list of booleans");
  expect_error([] { AutoencoderKLQwenImageConfig::from_json(R"({"z_dim": 4})"); }, "latents_mean");
  expect_error([] { AutoencoderKLQwenImageConfig::from_json(R"({"is_residual": true})"); }, "is_residual");
}

}  // namespace
}  // namespace kiln
