// AutoencoderKLFlux2 against diffusers, on the tiny FLUX.2 pipelines' VAEs (tools/goldens/flux2.py): encode
// and decode, the 2x2 patchify and the BatchNorm statistics as the pipelines apply them, and the layout of
// the real FLUX.2 VAE (tests/data/goldens/flux2/real_layouts.json).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "kiln/io/safetensors.h"
#include "kiln/models/autoencoder_kl_flux2.h"
#include "kiln/ops.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using models::AutoencoderKLFlux2;

std::unique_ptr<AutoencoderKLFlux2> load(const std::string& pipeline, DType dtype) {
  return models::load_autoencoder_kl_flux2(testing::data_path("models/" + pipeline + "/vae"), dtype);
}

TEST(AutoencoderKLFlux2, EncodeAndDecodeMatchDiffusersFloat32) {
  // The klein VAE's decoder has its own widths (decoder_block_out_channels).
  for (const char* pipeline : {"flux2-tiny-dev", "flux2-tiny-klein"}) {
    io::SafetensorsFile g(testing::data_path(std::string("goldens/flux2/vae_") + pipeline + ".safetensors"));
    auto vae = load(pipeline, float32);
    EXPECT_TRUE(vae->config().flux2);
    EXPECT_EQ(vae->config().scale_factor(), 8);
    const auto dist = vae->encode(g.tensor("image"));
    EXPECT_TRUE(testing::rel_max_error_within(dist.mean, g.tensor("mean"), 1e-4)) << pipeline;
    EXPECT_TRUE(testing::rel_max_error_within(dist.logvar, g.tensor("logvar"), 1e-4)) << pipeline;
    EXPECT_TRUE(testing::rel_max_error_within(vae->decode(g.tensor("z")), g.tensor("decoded"), 1e-4))
        << pipeline;
  }
  EXPECT_EQ(load("flux2-tiny-klein", float32)->config().decoder_channels(),
            (std::vector<int64_t>{8, 8, 16, 24}));
}

TEST(AutoencoderKLFlux2, Bfloat16StaysWithinRounding) {
  // The bound of the FLUX.1 VAE's bf16 test (tests/models/autoencoder_kl_test.cpp).
  io::SafetensorsFile g(testing::data_path("goldens/flux2/vae_flux2-tiny-dev-bf16.safetensors"));
  auto vae = load("flux2-tiny-dev-bf16", bfloat16);
  EXPECT_EQ(vae->running_var.dtype(), bfloat16);
  const Tensor decoded = vae->decode(g.tensor("z"));
  EXPECT_EQ(decoded.dtype(), bfloat16);
  EXPECT_TRUE(testing::rel_max_error_within(decoded, g.tensor("decoded"), 5e-2));
  EXPECT_TRUE(testing::rel_max_error_within(vae->encode(g.tensor("image")).mean, g.tensor("mean"), 5e-2));
}

// Flux2Pipeline.prepare_image_latents: encode (the mean), patchify, normalise by the BatchNorm statistics,
// pack to tokens; several reference images follow one another.
Tensor reference_tokens(const AutoencoderKLFlux2& vae, const Tensor& pixels) {
  const Tensor z =
      vae.normalize(AutoencoderKLFlux2::patchify(vae.encode(pixels.to(vae.running_mean.dtype())).mean));
  return z.reshape({1, z.size(1), z.size(2) * z.size(3)}).transpose(1, 2);
}

TEST(AutoencoderKLFlux2, ReferenceImageLatentsMatchThePipeline) {
  for (const char* golden : {"dev_ref1_64x48_s3", "dev_ref2_auto_s11", "klein_cfg_ref1_64x64_s2"}) {
    io::SafetensorsFile g(testing::data_path(std::string("goldens/flux2/") + golden + ".safetensors"));
    auto vae = load(g.metadata().at("pipeline"), float32);
    std::vector<Tensor> tokens;
    for (int i = 0; g.contains("ref" + std::to_string(i) + "_pixels"); ++i)
      tokens.push_back(reference_tokens(*vae, g.tensor("ref" + std::to_string(i) + "_pixels")));
    EXPECT_TRUE(testing::rel_max_error_within(concat(tokens, 1), g.tensor("image_latents"), 1e-4)) << golden;
  }
  // bf16: the encode and the statistics in bf16, as diffusers runs a bf16 VAE.
  io::SafetensorsFile g(testing::data_path("goldens/flux2/devbf16_ref1_64x48_s3.safetensors"));
  auto vae = load("flux2-tiny-dev-bf16", bfloat16);
  const Tensor tokens = reference_tokens(*vae, g.tensor("ref0_pixels"));
  EXPECT_EQ(tokens.dtype(), bfloat16);
  EXPECT_TRUE(testing::rel_max_error_within(tokens, g.tensor("image_latents"), 5e-2));
}

TEST(AutoencoderKLFlux2, PatchifyIsExactAndStatisticsRoundTrip) {
  const Tensor z = testing::values({2, 3, 4, 6}, 7);
  const Tensor p = AutoencoderKLFlux2::patchify(z);
  ASSERT_EQ(p.shape(), (Shape{2, 12, 2, 3}));
  // Channel c * 4 + dy * 2 + dx at (r, col) holds pixel (2r + dy, 2col + dx) of channel c.
  EXPECT_EQ(p.select(0, 1).select(0, 2 * 4 + 1 * 2 + 0).select(0, 1).select(0, 2).item(),
            z.select(0, 1).select(0, 2).select(0, 3).select(0, 4).item());
  EXPECT_TRUE(testing::all_close(AutoencoderKLFlux2::unpatchify(p), z, 0, 0));
  EXPECT_THROW(AutoencoderKLFlux2::patchify(Tensor::zeros({1, 3, 5, 6})), Error);

  auto vae = load("flux2-tiny-dev", float32);
  const Tensor x = testing::values({1, 32, 3, 2}, 9);
  EXPECT_TRUE(testing::all_close(vae->denormalize(vae->normalize(x)), x, 1e-6, 1e-6));
  EXPECT_FALSE(testing::all_close(vae->normalize(x), x, 1e-2, 1e-2));
  EXPECT_THROW(vae->normalize(Tensor::zeros({1, 31, 3, 2})), Error);
}

TEST(AutoencoderKLFlux2, WrongLoaderOrMissingStatisticsAreErrors) {
  EXPECT_THROW(models::load_autoencoder_kl(testing::data_path("models/flux2-tiny-dev/vae"), float32), Error);
  EXPECT_THROW(models::load_autoencoder_kl_flux2(testing::data_path("models/flux-tiny-dev/vae"), float32),
               Error);
  // A FLUX.2 VAE file without its BatchNorm statistics names the missing tensor.
  const std::string dir = testing::temp_dir("flux2_vae_no_bn");
  const std::string src = testing::data_path("models/flux2-tiny-dev/vae");
  io::SafetensorsFile f(src + "/diffusion_pytorch_model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& n : f.names())
    if (n != "bn.running_var") tensors.emplace_back(n, f.tensor(n));
  io::save_safetensors(dir + "/diffusion_pytorch_model.safetensors", tensors);
  std::ifstream in(src + "/config.json");
  std::ofstream(dir + "/config.json") << in.rdbuf();
  try {
    models::load_autoencoder_kl_flux2(dir, float32);
    FAIL() << "loaded without bn.running_var";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bn.running_var"), std::string::npos) << e.what();
  }
}

TEST(AutoencoderKLFlux2, MatchesTheRealFlux2Vae) {
  std::ifstream file(testing::data_path("goldens/flux2/real_layouts.json"));
  const nlohmann::json layouts = nlohmann::json::parse(file);
  const std::string path = testing::temp_dir("flux2_real_vae") + "/config.json";
  std::ofstream(path) << layouts["configs"]["vae"].dump();
  AutoencoderKLFlux2 vae(models::AutoencoderKLConfig::from_file(path));
  std::map<std::string, Shape> expected;
  for (const auto& [name, shape] : layouts["vae"].items()) expected[name] = shape.get<Shape>();
  std::map<std::string, Shape> mine;
  for (const auto& [name, shape] : vae.parameter_shapes()) mine[name] = shape;
  EXPECT_EQ(mine, expected);
  EXPECT_EQ(vae.patchified_channels(), 128);
  EXPECT_EQ(vae.config().scale_factor(), 8);
}

}  // namespace
}  // namespace kiln
