// Configs with absurd sizes (2^40 layers, widths whose products overflow) are refused by the readers, naming
// the file, the key and the limit, before a model of that size is built.
#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/models/t5_encoder.h"
#include "support/test_data.h"

namespace kiln::models {
namespace {

using kiln::testing::temp_dir;
using kiln::testing::write_text;

TEST(ConfigLimits, FluxTransformer) {
  EXPECT_KILN_ERROR(FluxTransformerConfig::from_json(R"({"num_layers": 1099511627776})", "t/config.json"),
                    "t/config.json: num_layers 1099511627776 exceeds the maximum 1024");
  // Each factor alone is allowed; their product is the model width, refused without overflowing.
  EXPECT_KILN_ERROR(
      FluxTransformerConfig::from_json(
          R"({"num_attention_heads": 1048576, "attention_head_dim": 1048576, "axes_dims_rope": [2]})"),
      "num_attention_heads * attention_head_dim 1099511627776 exceeds the maximum 1048576");
  EXPECT_KILN_ERROR(
      FluxTransformerConfig::from_json(R"({"axes_dims_rope": [4611686018427387904, 4611686018427387904]})"),
      "axes_dims_rope", "at most 1048576");
}

TEST(ConfigLimits, SD3Transformer) {
  EXPECT_KILN_ERROR(SD3TransformerConfig::from_json(R"({"num_layers": 1099511627776})", "t/config.json"),
                    "t/config.json: num_layers 1099511627776 exceeds the maximum 1024");
  EXPECT_KILN_ERROR(SD3TransformerConfig::from_json(R"({"pos_embed_max_size": 1000000000})"),
                    "pos_embed_max_size 1000000000 exceeds the maximum 4096");
}

TEST(ConfigLimits, Flux2TransformerAndTextEncoders) {
  EXPECT_KILN_ERROR(Flux2TransformerConfig::from_json(R"({"num_layers": 1099511627776})", "t/config.json"),
                    "t/config.json", "num_layers", "1024");
  const std::string dir = temp_dir("config_limits_flux2");
  write_text(dir + "/mistral.json", R"({"model_type": "mistral3", "text_config": {"model_type": "mistral",
      "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 1048576, "head_dim": 1048576}})");
  EXPECT_KILN_ERROR(DecoderTextEncoderConfig::from_file(dir + "/mistral.json"),
                    "num_attention_heads * head_dim 1099511627776 exceeds the maximum 1048576");
  write_text(dir + "/qwen.json", R"({"model_type": "qwen3", "vocab_size": 1099511627776, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4})");
  EXPECT_KILN_ERROR(DecoderTextEncoderConfig::from_file(dir + "/qwen.json"),
                    "qwen.json: vocab_size 1099511627776 exceeds the maximum 4194304");
}

TEST(ConfigLimits, TextEncodersAndVae) {
  const std::string dir = temp_dir("config_limits");
  write_text(dir + "/clip.json", R"({"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
                                     "num_hidden_layers": 1099511627776, "num_attention_heads": 4})");
  EXPECT_KILN_ERROR(ClipTextConfig::from_file(dir + "/clip.json"),
                    "clip.json: num_hidden_layers 1099511627776", "exceeds the maximum 1024");
  write_text(dir + "/t5.json", R"({"vocab_size": 1000, "d_model": 64, "d_kv": 8, "d_ff": -1, "num_layers": 2,
                                   "num_heads": 8})");
  EXPECT_KILN_ERROR(T5EncoderConfig::from_file(dir + "/t5.json"), "t5.json: d_ff -1 is below the minimum 1");
  write_text(dir + "/vae.json", R"({"block_out_channels": [32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
                                    32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
                                    32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
                                    32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32]})");
  // 65 resolution stages would make the scale factor 2^64.
  EXPECT_KILN_ERROR(AutoencoderKLConfig::from_file(dir + "/vae.json"),
                    "the number of block_out_channels 65 exceeds the maximum 16");
  write_text(dir + "/vae0.json", R"({"norm_num_groups": 0})");
  EXPECT_KILN_ERROR(AutoencoderKLConfig::from_file(dir + "/vae0.json"),
                    "norm_num_groups 0 is below the minimum 1");
}

}  // namespace
}  // namespace kiln::models
