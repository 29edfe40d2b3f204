// LoRA files that do not fit the pipeline, and LoRA calls out of order: each is an error naming the first
// mismatch (in file order) and what was expected, or, with ignore_mismatches, a load that skips and reports
// it.
#include <gtest/gtest.h>

#include "kiln/io/safetensors.h"
#include "kiln/ops/elementwise.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using Tensors = std::vector<std::pair<std::string, Tensor>>;

std::string write_lora(const std::string& name, const Tensors& tensors) {
  const std::string path = testing::temp_dir("lora_errors_" + name) + "/" + name + ".safetensors";
  io::save_safetensors(path, tensors);
  return path;
}

// A kohya pair on a FLUX.1 module of `out` x `in` features (the tiny model: 32 wide, 128 in the MLP).
Tensors kohya(const std::string& module, int64_t in, int64_t out, int64_t rank = 4) {
  return {{module + ".lora_down.weight", testing::values({rank, in}, 1)},
          {module + ".lora_up.weight", testing::values({out, rank}, 2)}};
}

Tensors operator+(Tensors a, const Tensors& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::unique_ptr<DiffusionPipeline> flux() {
  return DiffusionPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

#define EXPECT_HAS(text, needle) EXPECT_NE((text).find(needle), std::string::npos) << (text)

TEST(LoraErrors, FilesThatAreNoLoraOrMissing) {
  auto pipe = flux();
  const std::string missing = testing::temp_dir("lora_missing") + "/none.safetensors";
  EXPECT_HAS(error_of([&] { pipe->load_lora_weights(missing); }), "none.safetensors");
  const std::string model = testing::data_path("models/flux-tiny-dev/text_encoder/model.safetensors");
  EXPECT_HAS(error_of([&] { pipe->load_lora_weights(model); }), "not a LoRA file");
  EXPECT_TRUE(pipe->get_list_adapters().empty());
}

TEST(LoraErrors, TheFirstMismatchInTheFileIsNamed) {
  const Tensors good = kohya("lora_unet_double_blocks_0_img_attn_proj", 32, 32);
  const Tensors diffusers = {{"transformer.context_embedder.lora_A.weight", testing::values({4, 32}, 8)},
                             {"transformer.context_embedder.lora_B.weight", testing::values({32, 4}, 9)}};
  struct Case {
    const char* name;
    Tensors tensors;
    const char* tensor;  // the one named
    const char* why;
  };
  const std::vector<Case> cases = {
      {"no_such_block", good + kohya("lora_unet_double_blocks_7_img_attn_proj", 32, 32),
       "lora_unet_double_blocks_7_img_attn_proj.lora_down.weight",
       "the model has no layer transformer.transformer_blocks.7.attn.to_out.0"},
      {"wide_down", good + kohya("lora_unet_single_blocks_0_linear2", 161, 32),
       "lora_unet_single_blocks_0_linear2.lora_down.weight",
       "down [4, 161] does not fit layer transformer.single_transformer_blocks.0.proj_out of 160 input "
       "features"},
      {"qkv_rows", good + kohya("lora_unet_double_blocks_1_txt_attn_qkv", 32, 95),
       "lora_unet_double_blocks_1_txt_attn_qkv.lora_down.weight",
       "has 95 rows, but its layers have 96 output"},
      {"ranks",
       diffusers + Tensors{{"transformer.x_embedder.lora_A.weight", testing::values({4, 64}, 3)},
                           {"transformer.x_embedder.lora_B.weight", testing::values({32, 3}, 4)}},
       "transformer.x_embedder.lora_A.weight", "are not a low-rank pair"},
      {"half", Tensors{{"transformer.proj_out.lora_B.weight", testing::values({64, 4}, 5)}} + diffusers,
       "transformer.proj_out.lora_B.weight", "has no down"},
      {"diffusers_name_in_kohya", good + diffusers, "transformer.context_embedder.lora_A.weight",
       "not a kohya name"},
      {"unknown_module",
       kohya("lora_unet_double_blocks_0_img_attn_qkv_extra", 32, 32) +
           kohya("lora_unet_double_blocks_9_img_attn_proj", 32, 32),
       "lora_unet_double_blocks_0_img_attn_qkv_extra.lora_down.weight",
       "not a module of the FLUX.1 transformer"},
      {"clip_width", good + kohya("lora_te1_text_model_encoder_layers_0_mlp_fc1", 31, 40),
       "lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight",
       "does not fit layer text_encoder.text_model.encoder.layers.0.mlp.fc1 of 32 input features"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto pipe = flux();
    const std::string path = write_lora(c.name, c.tensors);
    const std::string e = error_of([&] { pipe->load_lora_weights(path, {.adapter_name = "x"}); });
    EXPECT_HAS(e, path);
    EXPECT_HAS(e, "'" + std::string(c.tensor) + "'");
    EXPECT_HAS(e, c.why);
    EXPECT_HAS(e, "ignore_mismatches");
    // Nothing of the file was loaded.
    EXPECT_TRUE(pipe->get_list_adapters().empty());
    // Asked to skip, the pairs that fit are loaded and the others reported.
    const auto report = pipe->load_lora_weights(path, {.adapter_name = "x", .ignore_mismatches = true});
    ASSERT_FALSE(report.skipped.empty());
    EXPECT_EQ(report.skipped.front().first.find(std::string(c.tensor).substr(0, 20)), 0u)
        << report.skipped.front().first;
    // One pair of each file fits (none in unknown_module, whose second block does not exist either).
    EXPECT_EQ(report.layers.count("transformer"), std::string(c.name) == "unknown_module" ? 0u : 1u);
  }
}

TEST(LoraErrors, AlphasAndDtypesThatAreNotUsable) {
  auto pipe = flux();
  Tensors two_alphas = kohya("lora_unet_img_in", 64, 32);
  two_alphas.push_back({"lora_unet_img_in.alpha", testing::values({2}, 6)});
  EXPECT_HAS(error_of([&] { pipe->load_lora_weights(write_lora("alphas", two_alphas)); }),
             "must hold one value");
  Tensors ints = kohya("lora_unet_img_in", 64, 32);
  ints[0].second = Tensor::zeros({4, 64}, int32);
  EXPECT_HAS(error_of([&] { pipe->load_lora_weights(write_lora("ints", ints)); }), "must be floating point");
}

TEST(LoraErrors, CallsOutOfOrder) {
  auto pipe = flux();
  const std::string a = testing::data_path("lora/flux_kohya.safetensors");
  EXPECT_EQ(pipe->load_lora_weights(a).adapter_name, "default_0");
  EXPECT_EQ(pipe->load_lora_weights(testing::data_path("lora/flux_xlabs.safetensors")).adapter_name,
            "default_1");
  EXPECT_EQ(pipe->get_active_adapters(), std::vector<std::string>{"default_1"});
  EXPECT_EQ(pipe->get_list_adapters().at("text_encoder"), std::vector<std::string>{"default_0"});
  EXPECT_HAS(error_of([&] { pipe->load_lora_weights(a, {.adapter_name = "default_0"}); }), "already in use");
  EXPECT_HAS(error_of([&] {
               pipe->set_adapters({"default_0", "style"});
             }),
             "no adapter named 'style' (loaded: default_0, default_1)");
  EXPECT_HAS(error_of([&] {
               pipe->set_adapters({"default_0"}, {0.5, 1.0});
             }),
             "1 adapter name(s) but 2 weight(s)");
  EXPECT_HAS(error_of([&] { pipe->fuse_lora({.components = {"text_encoder_2"}}); }),
             "'text_encoder_2' is not a component it loads LoRA into (transformer, text_encoder)");
  pipe->set_adapters({"default_0", "default_1"}, {0.5, 1.0});
  pipe->fuse_lora();
  EXPECT_HAS(error_of([&] { pipe->fuse_lora(); }), "call unfuse_lora() first");
  EXPECT_HAS(error_of([&] { pipe->set_adapters({"default_0"}); }), "fused into transformer");
  EXPECT_HAS(error_of([&] { pipe->load_lora_weights(a, {.adapter_name = "c"}); }), "unfuse_lora() first");
  EXPECT_HAS(error_of([&] { pipe->delete_adapters({"default_0"}); }), "unfuse_lora() first");
  pipe->unfuse_lora();
  pipe->delete_adapters({"default_0"});
  EXPECT_EQ(pipe->get_active_adapters(), std::vector<std::string>{"default_1"});
  EXPECT_HAS(error_of([&] { pipe->delete_adapters({"default_0"}); }), "no adapter named 'default_0'");
}

TEST(LoraErrors, SkippedTensorsAreReportedAsDiffusersSkipsThem) {
  auto pipe = flux();
  Tensors t =
      kohya("lora_unet_img_in", 64, 32) + kohya("lora_te2_encoder_block_0_layer_0_SelfAttention_q", 32, 32);
  t.push_back({"lora_unet_img_in.dora_scale", testing::values({1, 64}, 7)});
  const auto report = pipe->load_lora_weights(write_lora("skipped", t));
  EXPECT_EQ(report.layers.at("transformer"), 1);
  ASSERT_EQ(report.skipped.size(), 3u);
  EXPECT_HAS(report.skipped[0].second, "T5");
  EXPECT_HAS(report.skipped[2].second, "DoRA");
  EXPECT_HAS(report.describe(), "adapter 'default_0': kohya (sd-scripts), transformer 1 layer (3 skipped)");
}

}  // namespace
}  // namespace kiln
