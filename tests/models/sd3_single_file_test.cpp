// SD3Transformer2DModel::from_single_file on the tiny SD3.5-Medium-like transformer saved in Stability AI's
// layout (tools/gguf_refs/single_files.py): as bf16 safetensors and as GGUF Q8_0, each against diffusers'
// from_single_file on the same file, on the CFG batch of the mediumbf16 golden's first step.
#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "kiln/core/device_runtime.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using models::SD3Transformer2DModel;

const std::string kConfig = testing::data_path("models/sd3-tiny-medium/transformer");

Tensor run(const SD3Transformer2DModel& m) {
  const io::SafetensorsFile g(testing::data_path("gguf/single_file_goldens.safetensors"));
  Tensor out = m.forward(g.tensor("sd3_hidden"), g.tensor("sd3_encoder_hidden"), g.tensor("sd3_pooled"),
                         g.tensor("sd3_timestep"));
  synchronize();
  return out;
}

Tensor golden(const std::string& name) {
  return io::SafetensorsFile(testing::data_path("gguf/single_file_goldens.safetensors")).tensor(name);
}

// Why 6e-3: SD3Transformer.MatchesDiffusersBfloat16's bound on the same model and inputs.
TEST(SD3SingleFile, SaiSafetensorsEqualsTheDiffusersFolder) {
  auto single = SD3Transformer2DModel::from_single_file(
      testing::data_path("gguf/sd3-tiny-medium-sai.safetensors"), kConfig, bfloat16);
  const Tensor out = run(*single);
  // The same weights after the renames, qkv splits and (shift, scale) swaps: the very same bits.
  EXPECT_EQ(out.to_vector<float>(), run(*models::load_sd3_transformer(kConfig, bfloat16)).to_vector<float>());
  EXPECT_TRUE(testing::rel_max_error_within(out, golden("sd3_sai_out"), 6e-3));
}

TEST(SD3SingleFile, GgufQ8_0MatchesDiffusers) {
  auto model = SD3Transformer2DModel::from_single_file(testing::data_path("gguf/sd3-tiny-medium-Q8_0.gguf"),
                                                       kConfig, bfloat16);
  int quantized = 0;
  for (const auto& [name, t] : model->named_parameters()) quantized += t->defined() && t->dtype() == uint8;
  EXPECT_GT(quantized, 40);
  const Tensor out = run(*model);
  // diffusers expands Q8_0 in float16 (d * q rounded to float16) where the gguf package and Kiln use
  // float32; the tool measured that alone moving diffusers' output by 0.80% (sd3_q8_0_out against diffusers
  // on the gguf package's weights, sd3_q8_0_exact_weights_out). Against the latter Kiln meets the bf16 bound;
  // against diffusers' GGUF path the bound adds diffusers' own gap.
  EXPECT_TRUE(testing::rel_max_error_within(out, golden("sd3_q8_0_exact_weights_out"), 6e-3));
  EXPECT_TRUE(testing::rel_max_error_within(out, golden("sd3_q8_0_out"), 6e-3 + 8.1e-3));
}

TEST(SD3SingleFile, AMissingTensorIsNamed) {
  const io::SafetensorsFile f(testing::data_path("gguf/sd3-tiny-medium-sai.safetensors"));
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& n : f.names())
    if (n != "joint_blocks.2.context_block.adaLN_modulation.1.weight") tensors.emplace_back(n, f.tensor(n));
  const std::string path = testing::temp_dir("sd3_single_file") + "/missing.safetensors";
  io::save_safetensors(path, tensors);
  EXPECT_KILN_ERROR(SD3Transformer2DModel::from_single_file(path, kConfig, bfloat16), "missing.safetensors",
                    "SD3 single file",
                    "lacks tensor 'joint_blocks.2.context_block.adaLN_modulation.1.weight'",
                    "transformer_blocks.2.norm1_context.linear.weight");
}

}  // namespace
}  // namespace kiln
