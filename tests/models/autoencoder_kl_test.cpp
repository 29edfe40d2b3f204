// AutoencoderKL against diffusers, on the tiny FLUX pipelines' VAEs (tools/goldens/flux.py).
#include <gtest/gtest.h>

#include "kiln/io/safetensors.h"
#include "kiln/models/autoencoder_kl.h"
#include "support/test_data.h"

namespace kiln {
namespace {

TEST(AutoencoderKL, DecoderMatchesDiffusersFloat32) {
  for (const char* golden :
       {"schnell_cat_64x64_s0", "schnell_unicode_64x96_s42", "dev_unicode_80x48_s1234"}) {
    io::SafetensorsFile g(testing::data_path(std::string("goldens/flux/") + golden + ".safetensors"));
    const std::string pipeline = g.metadata().at("pipeline");
    auto vae = models::load_autoencoder_kl(testing::data_path("models/" + pipeline + "/vae"), float32);
    EXPECT_EQ(vae->config().scale_factor(), 8);
    const Tensor image = vae->decode(g.tensor("vae_decoder_in"));
    EXPECT_TRUE(testing::rel_max_error_within(image, g.tensor("vae_decoder_out"), 1e-4)) << golden;
  }
}

TEST(AutoencoderKL, EncoderMatchesDiffusersFloat32) {
  io::SafetensorsFile g(testing::data_path("goldens/flux/vae_encode_flux-tiny-schnell.safetensors"));
  auto vae = models::load_autoencoder_kl(testing::data_path("models/flux-tiny-schnell/vae"), float32);
  const auto dist = vae->encode(g.tensor("image"));
  EXPECT_TRUE(testing::rel_max_error_within(dist.mean, g.tensor("mean"), 1e-4));
  EXPECT_TRUE(testing::rel_max_error_within(dist.logvar, g.tensor("logvar"), 1e-4));
}

// bf16 rounds every conv/norm output to 8 significant bits; over ~20 layers the differences to torch's
// bf16 kernels (which round at other points inside conv and group_norm) accumulate to a few percent of
// the output range, so 5% of the largest magnitude is the bound.
TEST(AutoencoderKL, Bfloat16DecodeAndEncodeStayWithinRounding) {
  io::SafetensorsFile g(testing::data_path("goldens/flux/devbf16_cat_64x64_s0.safetensors"));
  auto vae = models::load_autoencoder_kl(testing::data_path("models/flux-tiny-dev-bf16/vae"), bfloat16);
  const Tensor image = vae->decode(g.tensor("vae_decoder_in"));
  EXPECT_EQ(image.dtype(), bfloat16);
  EXPECT_TRUE(testing::rel_max_error_within(image, g.tensor("vae_decoder_out"), 5e-2));
  io::SafetensorsFile e(testing::data_path("goldens/flux/vae_encode_flux-tiny-dev-bf16.safetensors"));
  EXPECT_TRUE(testing::rel_max_error_within(vae->encode(e.tensor("image")).mean, e.tensor("mean"), 5e-2));
}

TEST(AutoencoderKL, RejectsWrongLatentShape) {
  auto vae = models::load_autoencoder_kl(testing::data_path("models/flux-tiny-schnell/vae"), float32);
  EXPECT_THROW(vae->decode(Tensor::zeros({1, 4, 8, 8})), Error);
  EXPECT_THROW(vae->encode(Tensor::zeros({1, 3, 60, 64})), Error);
}

}  // namespace
}  // namespace kiln
