// The UNet family against diffusers 0.42: StableDiffusionPipeline (1.x) and StableDiffusionXLPipeline with
// their image-to-image and inpainting siblings, on the tiny pipelines of tools/goldens/sd.py
// (tools/goldens/sd_notes.md says what each stage does): CLIP's tokens and embeddings (clip_skip, SDXL's two
// towers, its zero negative embeddings), the UNet on diffusers' own inputs (SDXL's added conditions, a size
// whose latents are odd at the deeper levels), every sampler through the whole call, guidance_rescale,
// bfloat16; an SD 2.1-shaped pipeline (gelu CLIP, linear projections, upcast_attention, v-prediction;
// tools/goldens/sd2.py).
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

#include "kiln/families/stable_diffusion/stable_diffusion_pipeline.h"
#include "kiln/families/stable_diffusion/stable_diffusion_xl_pipeline.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::apply_lora_script;
using testing::expect_images_match;
using testing::GoldenFile;

// The rows of a golden's per-image tensor that hold each prompt's first image.
Tensor first_images(const Tensor& per_image, int64_t prompts, int images_per_prompt) {
  std::vector<Tensor> rows;
  for (int64_t p = 0; p < prompts; ++p) rows.push_back(per_image.narrow(0, p * images_per_prompt, 1));
  return concat(rows, 0);
}

bool is_xl(const GoldenFile& g) {
  return g.meta("pipeline").find("XL") != std::string::npos;
}

// The UNet on the first call's inputs as diffusers recorded them: its time embedding and its output.
void expect_unet_matches(const models::UNet2DConditionModel& unet, const GoldenFile& g,
                         const models::UNetAddedConditions& added, double tolerance) {
  const Tensor x = g["unet_in_step0"];
  const Tensor t = g["unet_t_step0"].to(float32);
  const models::UNet2DConditionModel::Trace trace =
      unet.forward_traced(x, t, g["unet_encoder_hidden_states_step0"], added);
  EXPECT_TRUE(testing::rel_max_error_within(trace.temb, g["temb_step0"], tolerance)) << g.name;
  EXPECT_TRUE(testing::rel_max_error_within(trace.out, g["unet_out_step0"], tolerance)) << g.name;
}

class StableDiffusionFloat32 : public ::testing::TestWithParam<const char*> {};

TEST_P(StableDiffusionFloat32, EveryStageMatchesDiffusers) {
  const GoldenFile g("sd", GetParam());
  const std::unique_ptr<DiffusionPipeline> loaded = g.load();
  const PipelineRequest request = g.text_request();
  if (!is_xl(g)) {
    auto& pipe = dynamic_cast<StableDiffusionPipeline&>(*loaded);
    const std::vector<std::string> prompts =
        request.prompts.empty() ? std::vector<std::string>{request.prompt} : request.prompts;
    EXPECT_TRUE(testing::all_close(pipe.tokenize(prompts), g["text_input_ids"], 0, 0)) << g.name;
    EXPECT_TRUE(testing::rel_max_error_within(
        pipe.encode_prompt(prompts, request.clip_skip.value_or(0)),
        first_images(g["prompt_embeds"], static_cast<int64_t>(prompts.size()), request.num_images_per_prompt),
        1e-5))
        << g.name;
    expect_unet_matches(pipe.unet(), g, {}, 1e-4);
  } else {
    auto& pipe = dynamic_cast<StableDiffusionXLPipeline&>(*loaded);
    const std::vector<std::string> prompts = {request.prompt};
    const std::vector<std::string> prompts_2 = {request.prompt_2.value_or(request.prompt)};
    const auto e = pipe.encode_prompt(prompts, prompts_2, request.clip_skip.value_or(0));
    EXPECT_TRUE(testing::rel_max_error_within(e.prompt_embeds, g["prompt_embeds"].narrow(0, 0, 1), 1e-5))
        << g.name;
    EXPECT_TRUE(testing::rel_max_error_within(e.pooled_prompt_embeds,
                                              g["pooled_prompt_embeds"].narrow(0, 0, 1), 1e-5))
        << g.name;
    expect_unet_matches(
        pipe.unet(), g,
        {.text_embeds = g["unet_text_embeds_step0"], .time_ids = g["add_time_ids"].to(float32)}, 1e-4);
  }
  // The whole call, its starting noise and first step on the way.
  PipelineRequest call = request;
  Tensor first_step;
  call.callback_on_step_end = [&](StepState& s) {
    if (s.step == 0) first_step = s.latents.to(float32);
  };
  expect_images_match((*loaded)(call), g);
  EXPECT_TRUE(testing::rel_max_error_within(first_step, g["latents_step0"], 1e-4)) << g.name;
}

INSTANTIATE_TEST_SUITE_P(
    Goldens, StableDiffusionFloat32,
    ::testing::Values("sd15_cat_64x64_s0", "sd15_negative_48x80_s1", "sd15_clipskip1_32x32_s2",
                      "sd15_nocfg_32x48_s3", "sd15_batch_32x32_s4", "sd15_oddlatent_36x28_s5",
                      "sd15_euler_32x32_s6", "sd15_euler_a_32x32_s7", "sd15_dpmpp2m_32x32_s8",
                      "sd15_dpmpp2m_karras_32x32_s9", "sd15_ddim_32x32_s10", "sdxl_cat_64x64_s0",
                      "sdxl_prompt2_negative_48x64_s1", "sdxl_empty_negative_32x32_s2",
                      "sdxl_micro_cond_32x48_s3", "sdxl_rescale_32x32_s4", "sdxl_dpmpp2m_karras_32x32_s5",
                      "sd2_vpred_32x32_s30", "sd2_euler_48x32_s31"));

class StableDiffusionEditing : public ::testing::TestWithParam<const char*> {};

TEST_P(StableDiffusionEditing, MatchesDiffusers) {
  const GoldenFile g("sd", GetParam());
  PipelineRequest request = g.text_request();
  if (!g.has("mask_image")) {  // image-to-image at the image's own size, as diffusers
    request.height.reset();
    request.width.reset();
  }
  expect_images_match((*g.load())(request), g);
}

INSTANTIATE_TEST_SUITE_P(Goldens, StableDiffusionEditing,
                         ::testing::Values("sd15_img2img_ref_b_s11", "sd15_inpaint_ref_a_s12",
                                           "sdxl_img2img_ref_a_s6", "sdxl_inpaint_ref_a_s7"));

// The image depends on the prompt (a dropped text term would not show in goldens of one prompt): the same
// call with another prompt moves the image by several 8-bit levels on average, in both pipelines.
TEST(StableDiffusionPipeline, ThePromptChangesTheImage) {
  for (const char* name : {"sd15_cat_64x64_s0", "sdxl_cat_64x64_s0"}) {
    const GoldenFile g("sd", name);
    PipelineRequest request = g.text_request();
    request.prompt = "a red fox sitting in the snow at night";
    const PipelineOutput out = (*g.load())(request);
    EXPECT_GT(testing::mean_level_difference(out.images[0].pixels, g["image_u8"].select(0, 0)), 2.0) << name;
  }
}

PipelineRequest lora_request(const GoldenFile& g) {
  PipelineRequest request = g.text_request();
  request.prompt = g.meta("prompt");
  return request;
}

// A LoRA in diffusers' (PEFT) layout on the UNet's and the text encoders' Linear layers
// (tools/goldens/sd_lora.py), unfused at a weight (SD1.5) and fused at a scale (SDXL): diffusers' image after
// the same calls.
TEST(StableDiffusionPipeline, DiffusersLorasGiveDiffusersImage) {
  for (const char* model : {"sd15", "sdxl"}) {
    const GoldenFile g("sd", std::string("lora_") + model);
    const std::unique_ptr<DiffusionPipeline> pipe = g.load();
    pipe->load_lora_weights(testing::data_path(std::string("lora/") + model + "_diffusers.safetensors"),
                            {.adapter_name = "sd"});
    apply_lora_script(*pipe, g);
    expect_images_match((*pipe)(lora_request(g)), g);
  }
}

// The lora_adapter_metadata header diffusers' save_lora_weights writes (PEFT's LoraConfig per component) sets
// the scales: unet.lora_alpha 8 over rank 4, one module at 2 by unet.alpha_pattern, text_encoder.lora_alpha 1
// (tools/goldens/sd_lora.py asserts diffusers took them); read as alpha = rank, the image would differ.
TEST(StableDiffusionPipeline, ALorasAdapterMetadataSetsItsScales) {
  const GoldenFile g("sd", "lora_sd15_metadata");
  const std::unique_ptr<DiffusionPipeline> pipe = g.load();
  pipe->load_lora_weights(testing::data_path("lora/sd15_metadata.safetensors"), {.adapter_name = "sd"});
  apply_lora_script(*pipe, g);
  expect_images_match((*pipe)(lora_request(g)), g);
}

// kohya's (sd-scripts) files (tools/goldens/sd_kohya_lora.py), every pair with an alpha other than its
// rank: SD1.5's in diffusers' flat names with 4-D pairs on the 1x1-convolution proj_in / proj_out and
// lora_te_ for CLIP; SDXL's in SGM's block names (input_blocks / middle_block / output_blocks) with lora_te1_
// (CLIP-L) and lora_te2_ (OpenCLIP bigG). Every pair loads (as in diffusers, which adapted as many layers),
// and the image is diffusers' unfused at a weight and fused at a scale.
TEST(StableDiffusionPipeline, KohyaLorasGiveDiffusersImage) {
  const std::map<std::string, std::map<std::string, int64_t>> layers = {
      {"sd15", {{"unet", 132}, {"text_encoder", 12}}},
      {"sdxl", {{"unet", 242}, {"text_encoder", 12}, {"text_encoder_2", 8}}}};
  for (const char* model : {"sd15", "sdxl"})
    for (const char* kind : {"unfused", "fused"}) {
      SCOPED_TRACE(std::string(model) + " " + kind);
      const GoldenFile g("sd", std::string("lora_kohya_") + model + "_" + kind);
      const std::unique_ptr<DiffusionPipeline> pipe = g.load();
      const lora::LoraLoadReport report = pipe->load_lora_weights(
          testing::data_path(std::string("lora/") + model + "_kohya.safetensors"), {.adapter_name = "sd"});
      EXPECT_EQ(report.format, lora::LoraFormat::Kohya);
      EXPECT_EQ(report.layers, layers.at(model));
      EXPECT_TRUE(report.skipped.empty()) << report.describe();
      apply_lora_script(*pipe, g);
      expect_images_match((*pipe)(lora_request(g)), g);
    }
}

// LoCon files (tools/goldens/sd_kohya_lora.py): kohya / LyCORIS pairs on every convolution of the UNet
// outside its attentions (conv_in, the ResNets' conv1 / conv2 / conv_shortcut, the down- and upsamplers'
// conv, conv_out: down a k x k convolution, up a 1x1 one) and Linear pairs on the time (and SDXL's added)
// embeddings and every time_emb_proj, each pair with its own rank and alpha; SD1.5's in diffusers' flat
// names, SDXL's in SGM's (in_layers_2, out_layers_3, skip_connection, op, input_blocks_0_0, out_2, ...), and
// SD1.5's pairs in diffusers' (PEFT) layout too. Every pair loads (diffusers adapted as many layers, each
// scaled by its alpha / rank), and the image is diffusers' unfused at a weight and fused at a scale, several
// levels from the image without it.
TEST(StableDiffusionPipeline, LoConLorasGiveDiffusersImage) {
  struct Case {
    const char* golden;
    const char* file;
    lora::LoraFormat format;
    int64_t layers;
  };
  for (const Case& c : {Case{"lora_locon_sd15_unfused", "sd15_locon", lora::LoraFormat::Kohya, 70},
                        Case{"lora_locon_sd15_fused", "sd15_locon", lora::LoraFormat::Kohya, 70},
                        Case{"lora_locon_peft_sd15", "sd15_locon_peft", lora::LoraFormat::Diffusers, 70},
                        Case{"lora_locon_sdxl_unfused", "sdxl_locon", lora::LoraFormat::Kohya, 72},
                        Case{"lora_locon_sdxl_fused", "sdxl_locon", lora::LoraFormat::Kohya, 72}}) {
    SCOPED_TRACE(c.golden);
    const GoldenFile g("sd", c.golden);
    const std::unique_ptr<DiffusionPipeline> pipe = g.load();
    // The LoRA changes diffusers' image visibly: the same call without it is far from it.
    const PipelineOutput plain = (*pipe)(lora_request(g));
    EXPECT_GT(testing::mean_level_difference(plain.images[0].pixels, g["image_u8"].select(0, 0)), 5.0);
    const lora::LoraLoadReport report = pipe->load_lora_weights(
        testing::data_path(std::string("lora/") + c.file + ".safetensors"), {.adapter_name = "sd"});
    EXPECT_EQ(report.format, c.format);
    EXPECT_EQ(report.layers, (std::map<std::string, int64_t>{{"unet", c.layers}}));
    EXPECT_TRUE(report.skipped.empty()) << report.describe();
    apply_lora_script(*pipe, g);
    expect_images_match((*pipe)(lora_request(g)), g);
  }
}

// Every parameter of `module` (its tensor: the same storage and view after a round trip).
std::vector<std::pair<std::string, Tensor>> parameters_of(nn::Module& module) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : module.named_parameters()) out.emplace_back(name, *t);
  return out;
}

nn::Module& unet_of(const DiffusionPipeline& pipe) {
  for (const auto& [name, module] : pipe.components())
    if (name == "unet") return *module;
  throw std::runtime_error("the pipeline has no unet");
}

// The LoCon changes the image (unfused, against the same pipeline without it); fused, it changes the
// convolutions' weights, and unfuse_lora gives every weight back as it was (the same tensor); unloaded, the
// pipeline draws its image without the LoRA, bit for bit.
TEST(StableDiffusionPipeline, LoConChangesTheImageAndUnfusesAndUnloadsExactly) {
  const GoldenFile g("sd", "lora_locon_sd15_unfused");
  const std::unique_ptr<DiffusionPipeline> pipe = g.load();
  const PipelineOutput plain = (*pipe)(lora_request(g));
  const std::vector<uint8_t>& plain_pixels = plain.images[0].pixels;
  const Tensor plain_u8 = Tensor::from_vector(plain_pixels, {static_cast<int64_t>(plain_pixels.size())});
  const std::vector<std::pair<std::string, Tensor>> before = parameters_of(unet_of(*pipe));

  pipe->load_lora_weights(testing::data_path("lora/sd15_locon.safetensors"), {.adapter_name = "sd"});
  apply_lora_script(*pipe, g);
  const PipelineOutput adapted = (*pipe)(lora_request(g));
  EXPECT_GT(testing::mean_level_difference(adapted.images[0].pixels, plain_u8), 2.0);

  pipe->fuse_lora({.lora_scale = 0.8});
  const std::vector<std::pair<std::string, Tensor>> fused = parameters_of(unet_of(*pipe));
  ASSERT_EQ(fused.size(), before.size());
  int64_t changed = 0;
  for (size_t i = 0; i < before.size(); ++i)
    changed += fused[i].second.raw_data() != before[i].second.raw_data();
  EXPECT_EQ(changed, 70);  // the 70 layers' weights, and nothing else
  pipe->unfuse_lora();
  const std::vector<std::pair<std::string, Tensor>> unfused = parameters_of(unet_of(*pipe));
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(unfused[i].second.raw_data(), before[i].second.raw_data()) << before[i].first;
    EXPECT_EQ(unfused[i].second.shape(), before[i].second.shape()) << before[i].first;
  }

  pipe->unload_lora_weights();
  EXPECT_TRUE(pipe->get_list_adapters().empty());
  EXPECT_EQ((*pipe)(lora_request(g)).images[0].pixels, plain.images[0].pixels);
}

// A LoCon pair whose shapes do not fit its convolution (a 1x1 kernel for a 3x3 convolution; a Linear's 2-d
// pair) is refused naming the tensor, the pair's shapes and the convolution's weight; ignore_mismatches skips
// it and loads the rest. A convolution's pair on a Linear (time_emb_proj), or a 1x1 convolution's on a layer
// that is a Linear (SDXL's proj_in), is refused too.
TEST(StableDiffusionPipeline, MismatchedConvolutionPairsAreRefusedByName) {
  const std::string path = testing::temp_dir("sd_kohya_locon") + "/locon.safetensors";
  const std::string conv = "lora_unet_down_blocks_0_resnets_0_conv1";
  const std::string out = "lora_unet_conv_out";
  const std::string temb = "lora_unet_down_blocks_0_resnets_0_time_emb_proj";
  const std::string attn = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";
  io::save_safetensors(path, {{conv + ".lora_down.weight", testing::values({4, 16, 1, 1}, 1)},
                              {temb + ".lora_down.weight", testing::values({4, 64, 3, 3}, 7)},
                              {temb + ".lora_up.weight", testing::values({16, 4, 1, 1}, 8)},
                              {conv + ".lora_up.weight", testing::values({16, 4, 1, 1}, 2)},
                              {out + ".lora_down.weight", testing::values({4, 16}, 5)},
                              {out + ".lora_up.weight", testing::values({4, 4}, 6)},
                              {attn + ".lora_down.weight", testing::values({4, 16}, 3)},
                              {attn + ".lora_up.weight", testing::values({16, 4}, 4)}});
  const std::unique_ptr<DiffusionPipeline> sd15 =
      DiffusionPipeline::from_pretrained(testing::data_path("models/sd15-tiny"));
  std::string error;
  try {
    sd15->load_lora_weights(path);
  } catch (const Error& e) {
    error = e.what();
  }
  for (const std::string& part :
       {"'" + conv + ".lora_down.weight'", std::string("down [4, 16, 1, 1] and up [16, 4, 1, 1]"),
        std::string("convolution unet.down_blocks.0.resnets.0.conv1 of weight [16, 16, 3, 3]"),
        std::string("expected down [4, 16, 3, 3] and up [16, 4, 1, 1]")})
    EXPECT_NE(error.find(part), std::string::npos) << part << " in: " << error;
  EXPECT_TRUE(sd15->get_list_adapters().empty());
  const lora::LoraLoadReport report = sd15->load_lora_weights(path, {.ignore_mismatches = true});
  EXPECT_EQ(report.layers, (std::map<std::string, int64_t>{{"unet", 1}}));
  std::map<std::string, std::string> skipped(report.skipped.begin(), report.skipped.end());
  EXPECT_EQ(skipped.size(), 3u);
  EXPECT_TRUE(skipped.count(conv)) << report.describe();
  EXPECT_NE(skipped[temb].find("down [4, 64, 3, 3] and up [16, 4, 1, 1] are a convolution's pair, but "
                               "unet.down_blocks.0.resnets.0.time_emb_proj is a Linear"),
            std::string::npos)
      << skipped[temb];
  EXPECT_NE(skipped[out].find("down [4, 16] and up [4, 4] do not fit the convolution unet.conv_out of weight "
                              "[4, 16, 3, 3] (expected down [4, 16, 3, 3] and up [4, 4, 1, 1])"),
            std::string::npos)
      << skipped[out];

  const std::string pointwise = testing::temp_dir("sd_kohya_pointwise") + "/pointwise.safetensors";
  const std::string proj_in = "lora_unet_input_blocks_4_1_proj_in";
  io::save_safetensors(pointwise, {{proj_in + ".lora_down.weight", testing::values({4, 24, 1, 1}, 1)},
                                   {proj_in + ".lora_up.weight", testing::values({24, 4, 1, 1}, 2)}});
  const std::unique_ptr<DiffusionPipeline> sdxl =
      DiffusionPipeline::from_pretrained(testing::data_path("models/sdxl-tiny"));
  error.clear();
  try {
    sdxl->load_lora_weights(pointwise);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("unet.down_blocks.1.attentions.0.proj_in is a Linear"), std::string::npos) << error;
}

TEST(StableDiffusionPipeline, Bfloat16StaysWithinItsNoise) {
  for (const char* name : {"sd15_bf16_cat_64x64_s0", "sdxl_bf16_cat_64x64_s0"}) {
    const GoldenFile g("sd", name);
    const PipelineOutput out = (*g.load())(g.text_request());
    const double mean = testing::mean_level_difference(out.images[0].pixels, g["image_u8"].select(0, 0));
    std::printf("[ levels   ] %s: mean %.3f vs diffusers\n", name, mean);
    EXPECT_LE(mean, 2.0) << name;
  }
}

// A finetune's single file (tools/goldens/sd_single_file.py: the tiny folders in Stability's layout, checked
// against diffusers' from_single_file) given as the model runs on the folder's configs: diffusers' image; a
// UNet-only file keeps the folder's text encoder and VAE.
TEST(StableDiffusionPipeline, ASingleFileAsTheModelGivesTheFoldersImage) {
  for (const auto& [file, golden] : {std::pair{"sd15_tiny", "sd15_cat_64x64_s0"},
                                     {"sd15_tiny_unet_only", "sd15_cat_64x64_s0"},
                                     {"sdxl_tiny", "sdxl_cat_64x64_s0"},
                                     {"sd2_tiny", "sd2_vpred_32x32_s30"}}) {
    const GoldenFile g("sd", golden);
    const std::string path =
        testing::data_path(std::string("goldens/sd_single_file/") + file + ".safetensors");
    const auto pipe = DiffusionPipeline::from_pretrained(
        path, {.single_file_config = testing::data_path("models/" + g.meta("model"))});
    EXPECT_STREQ(pipe->class_name(), g.meta("pipeline").c_str()) << file;
    const PipelineOutput out = (*pipe)(g.text_request());
    expect_images_match(out, g);
    EXPECT_EQ(out.images[0].metadata.at("model"), path) << file;
  }
  // A file of the other kind for the class it is given to, and a transformer alone, are refused by name.
  try {
    StableDiffusionXLPipeline::from_pretrained(
        testing::data_path("models/sdxl-tiny"),
        {.single_file = testing::data_path("goldens/sd_single_file/sd15_tiny.safetensors")});
    ADD_FAILURE() << "an SD1.x file was loaded as SDXL";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("an SD1.x checkpoint, which StableDiffusionPipeline runs"),
              std::string::npos)
        << e.what();
  }
  try {
    DiffusionPipeline::from_pretrained(
        testing::data_path("goldens/z_image/transformer_single_file.safetensors"));
    ADD_FAILURE() << "a transformer file was loaded as a whole pipeline";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a whole pipeline in one file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
