// CLIP and T5 text encoders against transformers, on the tiny FLUX pipelines made by tools/goldens/flux.py.
#include <gtest/gtest.h>

#include "kiln/io/safetensors.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/t5_encoder.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct Case {
  const char* golden;
  const char* pipeline;
};

const Case kFloat32Cases[] = {
    {"schnell_cat_64x64_s0", "flux-tiny-schnell"},
    {"schnell_unicode_64x96_s42", "flux-tiny-schnell"},
    {"schnell_long_96x64_s7", "flux-tiny-schnell"},
    {"dev_unicode_80x48_s1234", "flux-tiny-dev"},
};

std::string model_dir(const Case& c, const char* component) {
  return testing::data_path(std::string("models/") + c.pipeline + "/" + component);
}

TEST(ClipTextModel, PooledOutputMatchesTransformersFloat32) {
  for (const auto& c : kFloat32Cases) {
    io::SafetensorsFile golden(testing::data_path(std::string("goldens/flux/") + c.golden + ".safetensors"));
    auto model = models::load_clip_text_model(model_dir(c, "text_encoder"), float32);
    const auto out = model->forward(golden.tensor("clip_ids"));
    EXPECT_TRUE(testing::rel_max_error_within(out.pooled, golden.tensor("pooled_prompt_embeds"), 1e-4))
        << c.golden;
  }
}

TEST(T5EncoderModel, HiddenStatesMatchTransformersFloat32) {
  for (const auto& c : kFloat32Cases) {
    io::SafetensorsFile golden(testing::data_path(std::string("goldens/flux/") + c.golden + ".safetensors"));
    auto model = models::load_t5_encoder(model_dir(c, "text_encoder_2"), float32);
    const Tensor out = model->forward(golden.tensor("t5_ids"));
    EXPECT_TRUE(testing::rel_max_error_within(out, golden.tensor("prompt_embeds"), 1e-4)) << c.golden;
  }
}

// In bfloat16 every op rounds to 8 significant bits (relative step 2^-8 = 0.4%); transformers' bf16 T5 also
// rounds inside its unfused gelu_new chain and the q.k^T scores where Kiln keeps float32, so a few ulps of
// accumulated difference over 2 layers are expected: 3% of the largest value bounds it with margin.
TEST(TextEncoders, Bfloat16StaysWithinRoundingOfTransformers) {
  const Case c{"devbf16_cat_64x64_s0", "flux-tiny-dev-bf16"};
  io::SafetensorsFile golden(testing::data_path(std::string("goldens/flux/") + c.golden + ".safetensors"));
  auto clip = models::load_clip_text_model(model_dir(c, "text_encoder"), bfloat16);
  const auto pooled = clip->forward(golden.tensor("clip_ids")).pooled;
  EXPECT_EQ(pooled.dtype(), bfloat16);
  EXPECT_TRUE(testing::rel_max_error_within(pooled, golden.tensor("pooled_prompt_embeds"), 3e-2));
  auto t5 = models::load_t5_encoder(model_dir(c, "text_encoder_2"), bfloat16);
  const Tensor seq = t5->forward(golden.tensor("t5_ids"));
  EXPECT_EQ(seq.dtype(), bfloat16);
  EXPECT_TRUE(testing::rel_max_error_within(seq, golden.tensor("prompt_embeds"), 3e-2));
}

TEST(T5EncoderModel, RelativePositionBucketsMatchTransformers) {
  // Values from transformers' T5Attention._relative_position_bucket(bidirectional, 32 buckets, 128 distance):
  // relative positions -200, -20, -8, -7, -1, 0, 1, 7, 8, 20, 200 (key - query).
  const Tensor b = models::T5EncoderModel::relative_position_buckets(201, 32, 128);
  const auto v = b.to_vector<int64_t>();
  auto bucket = [&](int64_t rel) { return rel >= 0 ? v[rel] : v[static_cast<size_t>(-rel) * 201]; };
  EXPECT_EQ(bucket(0), 0);
  EXPECT_EQ(bucket(1), 17);
  EXPECT_EQ(bucket(7), 23);
  EXPECT_EQ(bucket(8), 24);
  EXPECT_EQ(bucket(20), 26);
  EXPECT_EQ(bucket(200), 31);
  EXPECT_EQ(bucket(-1), 1);
  EXPECT_EQ(bucket(-7), 7);
  EXPECT_EQ(bucket(-8), 8);
  EXPECT_EQ(bucket(-20), 10);
  EXPECT_EQ(bucket(-200), 15);
}

TEST(TextEncoders, MissingOrMismatchedWeightsAreClearErrors) {
  EXPECT_THROW(models::load_t5_encoder(testing::data_path("models/flux-tiny-schnell/text_encoder"), float32),
               Error);
  try {
    models::load_clip_text_model(testing::data_path("models/does-not-exist"), float32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does-not-exist"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
