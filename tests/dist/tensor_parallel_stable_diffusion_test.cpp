// The UNet family over two ranks: each rank holds half the heads of every attention and half the GEGLU
// feed-forward width of every transformer block of the UNet (the ResNets, samplers, the spatial
// transformers' norms and projections, CLIP and the VAE run whole on every rank). Every call draws the
// one-rank image (within one 8-bit level), which is diffusers' (tools/goldens/sd.py, sd_kohya_lora.py): SD1.5
// and SDXL, guided, editing, a kohya LoRA with LoCon unfused and fused, a single file, every execution mode.
// (A degree that does not divide the heads: tests/models/unet_2d_condition_test.cpp.)
#include <gtest/gtest.h>

#include "kiln/dist/device_mesh.h"
#include "kiln/dist/process_group.h"
#include "kiln/families/stable_diffusion/unet_pipeline.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops/layout.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::GoldenFile;

std::unique_ptr<DiffusionPipeline> load_split(const GoldenFile& g) {
  PipelineLoadOptions options;
  options.tensor_parallel = 2;
  return pipeline_class(g.meta("pipeline"), g.name)
      .load(testing::data_path("models/" + g.meta("model")), options);
}

PipelineRequest recorded_call(const GoldenFile& g) {
  PipelineRequest request = g.text_request();
  if (!g.has("mask_image") && g.has("image")) {  // image-to-image at the image's own size, as the goldens
    request.height.reset();
    request.width.reset();
  }
  return request;
}

TEST(TensorParallelStableDiffusion, TwoRanksDrawTheOneRankImage) {
  for (const char* name :
       {"sd15_cat_64x64_s0", "sd15_negative_48x80_s1", "sdxl_cat_64x64_s0", "sdxl_prompt2_negative_48x64_s1",
        "sd15_inpaint_ref_a_s12", "sdxl_img2img_ref_a_s6"}) {
    SCOPED_TRACE(name);
    const GoldenFile g("sd", name);
    const Image one = (*g.load())(recorded_call(g)).images.front();
    const PipelineOutput split = (*load_split(g))(recorded_call(g));
    EXPECT_LE(testing::max_level_difference(split.images.front(), one), 1);
    testing::expect_images_match(split, g);
  }
}

// Each rank reads its own rows of to_q / to_k / to_v and of each GEGLU half (its value and gate columns pair
// up), its own columns of to_out.0 and ff.net.2; everything outside the transformer blocks is whole.
TEST(TensorParallelStableDiffusion, EachRankHoldsItsShareOfTheTransformerBlocks) {
  const GoldenFile g("sd", "sd15_cat_64x64_s0");
  const std::unique_ptr<DiffusionPipeline> pipe = load_split(g);
  auto& unet = dynamic_cast<UNetPipeline&>(*pipe).unet();
  std::map<std::string, Tensor> local;
  for (const auto& [name, t] : unet.named_parameters()) local[name] = *t;
  const io::SafetensorsFile file(
      testing::data_path("models/sd15-tiny/unet/diffusion_pytorch_model.safetensors"));
  const int64_t r = dist::rank();
  const std::string block = "down_blocks.0.attentions.0.transformer_blocks.0.";
  // Width 16 and 4 heads of 4: 2 heads (8 features) a rank; GEGLU's [value | gate] of 64 + 64.
  const auto rows = [&](const std::string& name, std::vector<std::pair<int64_t, int64_t>> ranges) {
    std::vector<Tensor> pieces;
    for (const auto& [start, size] : ranges) pieces.push_back(file.tensor(name).narrow(0, start, size));
    return concat(pieces, 0);
  };
  for (const char* q : {"attn1.to_q.weight", "attn2.to_k.weight", "attn2.to_v.weight"})
    EXPECT_TRUE(testing::all_close(local.at(block + q), rows(block + q, {{8 * r, 8}}), 0, 0)) << q;
  EXPECT_EQ(local.at(block + "attn2.to_k.weight").shape(), (Shape{8, 32}));
  EXPECT_TRUE(testing::all_close(local.at(block + "ff.net.0.proj.weight"),
                                 rows(block + "ff.net.0.proj.weight", {{32 * r, 32}, {64 + 32 * r, 32}}), 0,
                                 0));
  EXPECT_TRUE(testing::all_close(local.at(block + "attn1.to_out.0.weight"),
                                 file.tensor(block + "attn1.to_out.0.weight").narrow(1, 8 * r, 8), 0, 0));
  EXPECT_EQ(local.at(block + "ff.net.2.weight").shape(), (Shape{16, 32}));
  EXPECT_EQ(local.at(block + "attn1.to_out.0.bias").shape(), (Shape{16}));  // added once, by rank 0
  EXPECT_EQ(local.at("down_blocks.0.resnets.0.conv1.weight").shape(), (Shape{16, 16, 3, 3}));
  // SD1.5's 1x1-convolution proj_in, held as the matrix it multiplies the tokens by.
  EXPECT_EQ(local.at("down_blocks.0.attentions.0.proj_in.weight").shape(), (Shape{16, 16}));
}

// kohya's LoRA with LoCon pairs (Linear pairs on the split layers take their rank's slice; the conv pairs
// stay whole): diffusers' image unfused and fused.
TEST(TensorParallelStableDiffusion, KohyaLoConLorasGiveDiffusersImage) {
  for (const char* kind : {"unfused", "fused"}) {
    SCOPED_TRACE(kind);
    const GoldenFile g("sd", std::string("lora_locon_sd15_") + kind);
    const std::unique_ptr<DiffusionPipeline> pipe = load_split(g);
    pipe->load_lora_weights(testing::data_path("lora/sd15_locon.safetensors"), {.adapter_name = "sd"});
    testing::apply_lora_script(*pipe, g);
    PipelineRequest request = g.text_request();
    request.prompt = g.meta("prompt");
    testing::expect_images_match((*pipe)(request), g);
  }
}

// A finetune's single file, split on load as a folder is.
TEST(TensorParallelStableDiffusion, ASingleFileSplitsAsAFolder) {
  const GoldenFile g("sd", "sdxl_cat_64x64_s0");
  PipelineLoadOptions options;
  options.tensor_parallel = 2;
  options.single_file_config = testing::data_path("models/sdxl-tiny");
  const auto pipe = DiffusionPipeline::from_pretrained(
      testing::data_path("goldens/sd_single_file/sdxl_tiny.safetensors"), options);
  testing::expect_images_match((*pipe)(g.text_request()), g);
}

// The collectives run as stream kernels (eager) and as graph nodes (fuse, compile, compile-blocks: the
// UNet's repeated ResNet and transformer blocks compiled).
TEST(TensorParallelStableDiffusion, EveryExecutionModeDrawsDiffusersImage) {
  const GoldenFile g("sd", "sd15_cat_64x64_s0");
  const std::unique_ptr<DiffusionPipeline> pipe = load_split(g);
  for (const ExecutionMode mode :
       {ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks}) {
    SCOPED_TRACE(execution_mode_name(mode));
    pipe->configure({.mode = mode});
    testing::expect_images_match((*pipe)(g.text_request()), g);
  }
}

// Only the UNet splits: asking for CLIP or the VAE is refused naming what the pipeline splits.
TEST(TensorParallelStableDiffusion, RefusesSplittingCLIP) {
  const dist::TensorParallelConfig parallel{.mesh = dist::DeviceMesh("cpu", {2})};
  PipelineLoadOptions options;
  options.parallel_config = {{"unet", parallel}, {"text_encoder", parallel}};
  try {
    DiffusionPipeline::from_pretrained(testing::data_path("models/sd15-tiny"), options);
    ADD_FAILURE() << "text_encoder was split";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'text_encoder' cannot be split"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("splits unet"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
