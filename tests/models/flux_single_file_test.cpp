// FluxTransformer2DModel::from_single_file on FLUX transformers saved as people download them
// (tools/gguf_refs/single_files.py, fp8_single_file.py): Black Forest Labs' layout as safetensors, with fp8
// weights, GGUF Q8_0, and a mixed Q4_K/Q8_0 GGUF, each against diffusers' from_single_file (with
// GGUFQuantizationConfig(compute_dtype=bf16) for GGUF) on the same file; quantized and fp8 weights stay so; a
// wrong or missing tensor is named.
#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "kiln/core/device_runtime.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/flux_single_file.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/nn/gguf_weights.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using models::FluxTransformer2DModel;

struct Inputs {
  Tensor hidden, encoder_hidden, pooled, timestep, guidance, txt_ids, img_ids;
};

const io::SafetensorsFile& goldens() {
  static const io::SafetensorsFile g(testing::data_path("gguf/single_file_goldens.safetensors"));
  return g;
}

Inputs inputs(const std::string& prefix) {
  const auto& g = goldens();
  Inputs in{g.tensor(prefix + "hidden"),
            g.tensor(prefix + "encoder_hidden"),
            g.tensor(prefix + "pooled"),
            g.tensor(prefix + "timestep"),
            {},
            g.tensor(prefix + "txt_ids"),
            g.tensor(prefix + "img_ids")};
  if (g.contains(prefix + "guidance")) in.guidance = g.tensor(prefix + "guidance");
  return in;
}

Tensor run(const FluxTransformer2DModel& m, const Inputs& in) {
  Tensor out =
      m.forward(in.hidden, in.encoder_hidden, in.pooled, in.timestep, in.guidance, in.txt_ids, in.img_ids);
  synchronize();
  return out;
}

const std::string kTinyConfig = testing::data_path("models/flux-tiny-dev-bf16/transformer");

// How many parameters are kept as raw blocks (uint8), and of which total.
std::pair<int, int> quantized_count(FluxTransformer2DModel& m) {
  int q = 0, n = 0;
  for (const auto& [name, t] : m.named_parameters()) {
    ++n;
    q += t->defined() && t->dtype() == uint8;
  }
  return {q, n};
}

// Why 1e-2 for every case: the bound of FluxTransformer.MatchesDiffusersBfloat16 (bf16 rounding tipping the
// other way where kernels sum in another order, carried through the blocks).
TEST(FluxSingleFile, BflSafetensorsEqualsTheDiffusersFolder) {
  auto single = FluxTransformer2DModel::from_single_file(
      testing::data_path("gguf/flux-tiny-dev-bfl.safetensors"), {.config = kTinyConfig, .dtype = bfloat16});
  auto folder = models::load_flux_transformer(kTinyConfig, bfloat16);
  const Inputs in = inputs("tiny_");
  const Tensor out = run(*single, in);
  // Same weights after the renames, splits and the scale/shift swap: the very same bits.
  EXPECT_EQ(out.to_vector<float>(), run(*folder, in).to_vector<float>());
  EXPECT_TRUE(testing::rel_max_error_within(out, goldens().tensor("bfl_out"), 1e-2));
}

TEST(FluxSingleFile, GgufQ8_0MatchesDiffusers) {
  auto model = FluxTransformer2DModel::from_single_file(testing::data_path("gguf/flux-tiny-dev-Q8_0.gguf"),
                                                        {.config = kTinyConfig, .dtype = bfloat16});
  // Every Linear weight stays Q8_0 in memory: the file's 36, with each of the 4 fused qkv split in 3 and
  // each of the 2 single-block linear1 in 4.
  EXPECT_EQ(quantized_count(*model).first, 36 + 4 * (3 - 1) + 2 * (4 - 1));
  // Quantized weights count at their size in memory: 34 bytes per 32 weights instead of bf16's 64.
  auto plain = models::load_flux_transformer(kTinyConfig, bfloat16);
  size_t quantized_bytes = 0, plain_bytes = 0;
  for (const auto& [name, t] : model->named_parameters())
    if (t->defined() && t->dtype() == uint8) quantized_bytes += t->nbytes();
  for (const auto& [name, t] : plain->named_parameters())
    if (t->defined() && t->dim() == 2) plain_bytes += t->nbytes();
  EXPECT_EQ(plain->parameter_bytes(bfloat16) - model->parameter_bytes(bfloat16),
            plain_bytes - quantized_bytes);
  EXPECT_EQ(quantized_bytes * 64, plain_bytes * 34);
  const Tensor out = run(*model, inputs("tiny_"));
  EXPECT_EQ(out.dtype(), bfloat16);
  EXPECT_TRUE(testing::rel_max_error_within(out, goldens().tensor("q8_0_out"), 1e-2));
  // Model offload hands the quantized blocks' file pages back; the next forward reads them again unchanged.
  EXPECT_GE(model->release_weights(), quantized_bytes);
  EXPECT_EQ(run(*model, inputs("tiny_")).to_vector<float>(), out.to_vector<float>());
  // Sequential offload: with a resident-weight budget of nothing, each quantized weight leaves the process
  // once the next one is read; the result is the same.
  set_resident_weight_budget(0);
  const Tensor budgeted = run(*model, inputs("tiny_"));
  set_resident_weight_budget(std::nullopt);
  EXPECT_EQ(budgeted.to_vector<float>(), out.to_vector<float>());
}

// Linear weights in float8_e4m3fn (and the single blocks' in float8_e5m2), as flux1-dev-fp8 files hold them:
// kept in fp8 (one byte per weight, the file's pages), each product on their exact bf16 values, which is what
// diffusers computes after widening them on load.
TEST(FluxSingleFile, Fp8SafetensorsStaysFp8AndMatchesDiffusers) {
  auto model =
      FluxTransformer2DModel::from_single_file(testing::data_path("gguf/flux-tiny-dev-bfl-fp8.safetensors"),
                                               {.config = kTinyConfig, .dtype = bfloat16});
  // All of the file's 36 fp8 weights, fused qkv and linear1 split as for Q8_0 above.
  EXPECT_EQ(quantized_count(*model).first, 36 + 4 * (3 - 1) + 2 * (4 - 1));
  auto plain = models::load_flux_transformer(kTinyConfig, bfloat16);
  size_t fp8_bytes = 0, plain_bytes = 0;
  for (const auto& [name, t] : model->named_parameters())
    if (t->defined() && t->dtype() == uint8) {
      fp8_bytes += t->nbytes();
      // The file's pages, but for the final norm's, whose (shift, scale) halves are swapped into a copy.
      EXPECT_EQ(t->storage()->is_file_pages(), name != "norm_out.linear.weight") << name;
    }
  for (const auto& [name, t] : plain->named_parameters())
    if (t->defined() && t->dim() == 2) plain_bytes += t->nbytes();
  EXPECT_EQ(fp8_bytes * 2, plain_bytes);
  EXPECT_EQ(plain->parameter_bytes(bfloat16) - model->parameter_bytes(bfloat16), plain_bytes - fp8_bytes);

  const io::SafetensorsFile fp8_goldens(testing::data_path("gguf/fp8_single_file_goldens.safetensors"));
  const Tensor out = run(*model, inputs("tiny_"));
  EXPECT_EQ(out.dtype(), bfloat16);
  EXPECT_TRUE(testing::rel_max_error_within(out, fp8_goldens.tensor("fp8_out"), 1e-2));
  // The other execution modes read fp8 weights too (bound as for Q4_K below).
  {
    EagerModeGuard fuse(EagerMode::DeferAndFuse);
    EXPECT_TRUE(testing::rel_max_error_within(run(*model, inputs("tiny_")), out, 2e-2));
  }
  model->compile_repeated_blocks();
  EXPECT_TRUE(testing::rel_max_error_within(run(*model, inputs("tiny_")), out, 2e-2));
  // In float32, against diffusers in float32 (the bound of FluxTransformer's float32 goldens, 1e-4).
  auto f32 =
      FluxTransformer2DModel::from_single_file(testing::data_path("gguf/flux-tiny-dev-bfl-fp8.safetensors"),
                                               {.config = kTinyConfig, .dtype = float32});
  EXPECT_EQ(quantized_count(*f32).first, 36 + 4 * (3 - 1) + 2 * (4 - 1));
  Inputs in32 = inputs("tiny_");
  for (Tensor* t : {&in32.hidden, &in32.encoder_hidden, &in32.pooled, &in32.timestep, &in32.guidance,
                    &in32.txt_ids, &in32.img_ids})
    *t = t->to(float32);
  EXPECT_TRUE(testing::rel_max_error_within(run(*f32, in32), fp8_goldens.tensor("fp8_f32_out"), 1e-4));
}

TEST(FluxSingleFile, GgufQ4_KMatchesDiffusersWithTheConfigReadOffShapes) {
  const std::string path = testing::data_path("gguf/flux-256-Q4_K.gguf");
  const models::FluxTransformerConfig inferred = models::infer_flux_config(nn::GgufWeights(path));
  const models::FluxTransformerConfig want =
      models::FluxTransformerConfig::from_file(testing::data_path("gguf/flux-256/transformer"));
  EXPECT_EQ(inferred.inner_dim(), want.inner_dim());
  EXPECT_EQ(inferred.num_layers, 1);
  EXPECT_EQ(inferred.num_single_layers, 1);
  EXPECT_EQ(inferred.joint_attention_dim, 256);
  EXPECT_FALSE(inferred.guidance_embeds);
  EXPECT_EQ(inferred.axes_dims_rope, want.axes_dims_rope);

  auto model = FluxTransformer2DModel::from_single_file(path, {.dtype = bfloat16});
  const Inputs in = inputs("wide_");
  const Tensor out = run(*model, in);
  // diffusers dequantizes K-quants in float16 (d * scale and d * q - dmin * min each rounded to float16)
  // where the gguf package and Kiln use float32; the tool measured that alone moving diffusers' output by
  // 1.18% (q4_k_out against diffusers run on the gguf package's weights, q4_k_exact_weights_out). Against
  // the latter Kiln meets the bf16 bound; against diffusers' GGUF path the bound adds diffusers' own gap.
  EXPECT_TRUE(testing::rel_max_error_within(out, goldens().tensor("q4_k_exact_weights_out"), 1e-2));
  EXPECT_TRUE(testing::rel_max_error_within(out, goldens().tensor("q4_k_out"), 1e-2 + 1.2e-2));

  // The other execution modes on quantized weights: fused ops round once where eager rounds after every op,
  // so bf16 results move by ulps (the bound of ExecutionModes.EveryModeMatchesDiffusersInBfloat16).
  {
    EagerModeGuard fuse(EagerMode::DeferAndFuse);
    EXPECT_TRUE(testing::rel_max_error_within(run(*model, in), out, 2e-2));
  }
  model->compile_repeated_blocks();
  EXPECT_TRUE(testing::rel_max_error_within(run(*model, in), out, 2e-2));
}

// A copy of the BFL file with `drop` removed and `extra` tensors added.
std::string edited_copy(const std::string& name, const std::string& drop,
                        const std::vector<std::pair<std::string, Tensor>>& extra) {
  const io::SafetensorsFile f(testing::data_path("gguf/flux-tiny-dev-bfl.safetensors"));
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& n : f.names())
    if (n != drop) tensors.emplace_back(n, f.tensor(n));
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  const std::string path = testing::temp_dir("flux_single_file") + "/" + name;
  io::save_safetensors(path, tensors);
  return path;
}

TEST(FluxSingleFile, MissingWrongAndUnexpectedTensorsAreNamed) {
  const models::FluxTransformer2DModel::SingleFileOptions options{.config = kTinyConfig};
  EXPECT_KILN_ERROR(
      FluxTransformer2DModel::from_single_file(
          edited_copy("missing.safetensors", "double_blocks.1.txt_attn.qkv.weight", {}), options),
      "missing.safetensors", "lacks tensor 'double_blocks.1.txt_attn.qkv.weight'",
      "transformer_blocks.1.attn.add_");
  EXPECT_KILN_ERROR(FluxTransformer2DModel::from_single_file(
                        edited_copy("rows.safetensors", "single_blocks.0.linear1.weight",
                                    {{"single_blocks.0.linear1.weight", Tensor::zeros({230, 32})}}),
                        options),
                    "rows.safetensors", "single_blocks.0.linear1.weight",
                    "230 rows but the config expects 224");
  EXPECT_KILN_ERROR(
      FluxTransformer2DModel::from_single_file(
          edited_copy("extra.safetensors", "", {{"double_blocks.0.img_attn.lora", Tensor::zeros({2})}}),
          options),
      "extra.safetensors", "do not belong", "double_blocks.0.img_attn.lora");
  EXPECT_KILN_ERROR(
      FluxTransformer2DModel::from_single_file(testing::data_path("gguf/flux-tiny-dev-Q8_0.gguf"), {}),
      "flux-tiny-dev-Q8_0.gguf", "heads of 16", "config.json");
  EXPECT_KILN_ERROR(FluxTransformer2DModel::from_single_file("/nonexistent/flux.gguf", {}),
                    "/nonexistent/flux.gguf", "no such file");
}

}  // namespace
}  // namespace kiln
