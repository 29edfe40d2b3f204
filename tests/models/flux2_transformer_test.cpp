// Flux2Transformer2DModel against diffusers, stage by stage, on the tiny FLUX.2 pipelines of
// tools/goldens/flux2.py, and its parameter layout against the real FLUX.2-dev and klein 4B / 9B checkpoints
// (tests/data/goldens/flux2/real_layouts.json).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "kiln/io/safetensors.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "support/golden_steps.h"
#include "support/layout_source.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using models::Flux2Transformer2DModel;
using models::Flux2TransformerConfig;
using StepInputs = testing::Flux2StepInputs;
using testing::flux2_step0_inputs;

Tensor run(const Flux2Transformer2DModel& model, const StepInputs& in,
           models::Flux2TransformerTrace* trace = nullptr) {
  return model.forward(in.hidden, in.encoder_hidden, in.timestep, in.guidance, in.txt_ids, in.img_ids, trace);
}

std::unique_ptr<Flux2Transformer2DModel> load(const std::string& pipeline, DType dtype) {
  return models::load_flux2_transformer(testing::data_path("models/" + pipeline + "/transformer"), dtype);
}

TEST(Flux2Transformer, MatchesDiffusersFloat32) {
  // dev (guidance embedding) and klein (none, sharded checkpoint); square and non-square grids; batch 2
  // (num_images_per_prompt); one and two reference images appended to the noise (their ids on axis 0).
  for (const char* golden :
       {"dev_64x64_s0", "dev_80x48_s1234", "dev_96x64_s7_n2", "dev_ref1_64x48_s3", "dev_ref2_auto_s11",
        "dev_ref1_48x64_s5_n2", "klein_cfg_64x64_s0", "klein_nocfg_48x80_s9", "klein_cfg_ref1_64x64_s2"}) {
    const StepInputs in = flux2_step0_inputs(golden);
    auto model = load(in.pipeline, float32);
    EXPECT_EQ(model->config().guidance_embeds, in.pipeline != "flux2-tiny-klein") << golden;
    EXPECT_EQ(in.guidance.defined(), in.pipeline != "flux2-tiny-klein") << golden;
    const Tensor out = run(*model, in);
    EXPECT_EQ(out.dtype(), float32);
    EXPECT_TRUE(testing::rel_max_error_within(out, in.expected, 1e-4)) << golden;
  }
}

TEST(Flux2Transformer, NegativePromptPassMatchesDiffusers) {
  // Flux2KleinPipeline's classifier-free guidance runs a second pass with the negative embeddings, whose text
  // length differs from the prompt's.
  for (const char* golden : {"klein_cfg_64x64_s0", "klein_cfg_ref1_64x64_s2"}) {
    StepInputs in = flux2_step0_inputs(golden);
    io::SafetensorsFile g(testing::data_path(std::string("goldens/flux2/") + golden + ".safetensors"));
    in.encoder_hidden = g.tensor("negative_prompt_embeds");
    in.txt_ids = g.tensor("transformer_in_txt_ids_uncond").select(0, 0);
    EXPECT_TRUE(testing::all_close(in.txt_ids, models::flux2_text_ids(in.encoder_hidden.size(1)), 0, 0));
    auto model = load(in.pipeline, float32);
    EXPECT_TRUE(
        testing::rel_max_error_within(run(*model, in), g.tensor("transformer_out_step0_uncond"), 1e-4))
        << golden;
  }
}

TEST(Flux2Transformer, EveryStageMatchesDiffusers) {
  for (const char* golden : {"dev_ref2_auto_s11", "klein_cfg_64x64_s0"}) {
    const StepInputs in = flux2_step0_inputs(golden);
    io::SafetensorsFile g(testing::data_path(std::string("goldens/flux2/") + golden + ".safetensors"));
    auto model = load(in.pipeline, float32);
    models::Flux2TransformerTrace trace;
    run(*model, in, &trace);
    auto expect_stage = [&](const Tensor& mine, const std::string& name) {
      EXPECT_TRUE(testing::rel_max_error_within(mine, g.tensor(name), 1e-4)) << golden << " " << name;
    };
    expect_stage(trace.temb, "stage_temb");
    expect_stage(trace.mod_img, "stage_mod_img");
    expect_stage(trace.mod_txt, "stage_mod_txt");
    expect_stage(trace.mod_single, "stage_mod_single");
    expect_stage(trace.x_embedded, "stage_x_embedded");
    expect_stage(trace.context_embedded, "stage_context_embedded");
    ASSERT_EQ(static_cast<int64_t>(trace.double_blocks.size()), model->config().num_layers);
    for (size_t i = 0; i < trace.double_blocks.size(); ++i) {
      expect_stage(trace.double_blocks[i].first, "stage_double" + std::to_string(i) + "_context");
      expect_stage(trace.double_blocks[i].second, "stage_double" + std::to_string(i) + "_hidden");
    }
    ASSERT_EQ(static_cast<int64_t>(trace.single_blocks.size()), model->config().num_single_layers);
    for (size_t i = 0; i < trace.single_blocks.size(); ++i)
      expect_stage(trace.single_blocks[i], "stage_single" + std::to_string(i));
    expect_stage(trace.norm_out, "stage_norm_out");
  }
}

TEST(Flux2Transformer, MatchesDiffusersBfloat16) {
  for (const char* golden : {"devbf16_64x64_s0", "devbf16_ref1_64x48_s3"}) {
    const StepInputs in = flux2_step0_inputs(golden);
    ASSERT_EQ(in.hidden.dtype(), bfloat16);
    ASSERT_EQ(in.timestep.dtype(), bfloat16);
    auto model = load("flux2-tiny-dev-bf16", bfloat16);
    const Tensor out = run(*model, in);
    EXPECT_EQ(out.dtype(), bfloat16);
    // The bound FLUX.1's bf16 transformer test uses (tests/models/flux_transformer_test.cpp): Kiln rounds at
    // diffusers' points, and what is left are bf16 roundings that tip the other way where kernels sum in
    // another order, about one bf16 ulp of the largest output.
    EXPECT_TRUE(testing::rel_max_error_within(out, in.expected, 1e-2)) << golden;
  }
}

TEST(Flux2Transformer, BatchElementsAreIndependent) {
  // Batch 2 with different latents, timesteps and guidance per element: each equals its batch-1 result.
  const StepInputs a = flux2_step0_inputs("dev_64x64_s0");
  auto model = load(a.pipeline, float32);
  StepInputs b = a;
  b.hidden = mul(a.hidden, -0.5);
  b.timestep = Tensor::from_vector(std::vector<float>{0.25f}, {1});
  b.guidance = Tensor::from_vector(std::vector<float>{1.5f}, {1});
  b.encoder_hidden = mul(a.encoder_hidden, 0.75);
  StepInputs both = a;
  both.hidden = concat({a.hidden, b.hidden}, 0);
  both.encoder_hidden = concat({a.encoder_hidden, b.encoder_hidden}, 0);
  both.timestep = concat({a.timestep, b.timestep}, 0);
  both.guidance = concat({a.guidance, b.guidance}, 0);
  const Tensor out = run(*model, both);
  ASSERT_EQ(out.shape(), (Shape{2, a.hidden.size(1), a.hidden.size(2)}));
  EXPECT_TRUE(testing::rel_max_error_within(out.select(0, 0).unsqueeze(0), a.expected, 1e-4));
  const Tensor alone = run(*model, b);
  EXPECT_TRUE(testing::rel_max_error_within(out.select(0, 1).unsqueeze(0), alone, 1e-5));
  EXPECT_FALSE(testing::rel_max_error_within(alone, a.expected, 1e-2));
  // The guidance embedding matters on dev; without one (diffusers allows it) only the timestep embeds.
  StepInputs no_guidance = a;
  no_guidance.guidance = Tensor();
  EXPECT_FALSE(testing::rel_max_error_within(run(*model, no_guidance), a.expected, 1e-2));
}

TEST(Flux2Transformer, ParametersMatchTheRealCheckpoints) {
  std::ifstream file(testing::data_path("goldens/flux2/real_layouts.json"));
  ASSERT_TRUE(file);
  const nlohmann::json layouts = nlohmann::json::parse(file);
  // Parameter counts of the real models (from the layouts): FLUX.2-dev 32.2 B, klein 4B 3.9 B, klein 9B 9.1
  // B.
  const std::map<std::string, std::pair<int64_t, bool>> variants = {{"transformer_dev", {6144, true}},
                                                                    {"transformer_klein_4b", {3072, false}},
                                                                    {"transformer_klein_9b", {4096, false}}};
  for (const auto& [key, expect] : variants) {
    const Flux2TransformerConfig config =
        Flux2TransformerConfig::from_json(layouts.at("configs").at(key).dump(), key + "/config.json");
    EXPECT_EQ(config.inner_dim(), expect.first) << key;
    EXPECT_EQ(config.guidance_embeds, expect.second) << key;
    EXPECT_EQ(config.out_channels, 128) << key;  // "out_channels": null
    Flux2Transformer2DModel model(config);       // registers shapes only: nothing is allocated

    std::map<std::string, Shape> expected;
    int64_t expected_numel = 0;
    for (const auto& [name, shape] : layouts.at(key).items()) {
      expected[name] = shape.get<Shape>();
      expected_numel += shape_numel(expected[name]);
    }
    std::map<std::string, Shape> registered;
    for (const auto& [name, slot] : model.named_parameters()) registered[name];
    ASSERT_EQ(registered.size(), model.named_parameters().size()) << "duplicate parameter names";
    std::vector<std::string> missing, extra;
    for (const auto& [name, shape] : expected)
      if (!registered.count(name)) missing.push_back(name);
    for (const auto& [name, shape] : registered)
      if (!expected.count(name)) extra.push_back(name);
    EXPECT_TRUE(missing.empty()) << key << ": " << missing.size() << " missing, first " << missing.front();
    EXPECT_TRUE(extra.empty()) << key << ": " << extra.size() << " unexpected, first " << extra.front();
    EXPECT_EQ(model.num_parameters(), expected_numel) << key;
    nn::LoadOptions options;
    options.dtype = bfloat16;
    EXPECT_NO_THROW(model.load_weights(testing::LayoutSource(expected, options.dtype), options)) << key;
    for (const auto& [name, slot] : model.named_parameters())
      EXPECT_EQ(slot->shape(), expected[name]) << name;
  }
}

std::string config_error(const std::string& json) {
  try {
    Flux2TransformerConfig::from_json(json, "transformer/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Flux2Transformer, ConfigDefaultsAndErrors) {
  // Absent keys take diffusers' defaults (the FLUX.2-dev values); out_channels follows in_channels.
  const Flux2TransformerConfig d = Flux2TransformerConfig::from_json(R"({"in_channels": 64})");
  EXPECT_EQ(d.in_channels, 64);
  EXPECT_EQ(d.out_channels, 64);
  EXPECT_EQ(d.num_layers, 8);
  EXPECT_EQ(d.num_single_layers, 48);
  EXPECT_EQ(d.inner_dim(), 6144);
  EXPECT_EQ(d.mlp_hidden_dim(), 18432);
  EXPECT_EQ(d.joint_attention_dim, 15360);
  EXPECT_EQ(d.axes_dims_rope, (std::vector<int64_t>{32, 32, 32, 32}));
  EXPECT_EQ(d.rope_theta, 2000.0);
  EXPECT_TRUE(d.guidance_embeds);
  const Flux2TransformerConfig tiny =
      Flux2TransformerConfig::from_file(testing::data_path("models/flux2-tiny-klein/transformer"));
  EXPECT_FALSE(tiny.guidance_embeds);
  EXPECT_EQ(tiny.axes_dims_rope, (std::vector<int64_t>{2, 6, 4, 4}));
  EXPECT_EQ(tiny.mlp_hidden_dim(), 96);

  for (const auto& [json, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"patch_size": 2})", "patch_size"},
           {R"({"_class_name": "FluxTransformer2DModel"})", "Flux2Transformer2DModel"},
           {R"({"pooled_projection_dim": 768})", "pooled_projection_dim"},
           {R"({"axes_dims_rope": [32, 32, 32, 16]})", "axes_dims_rope"},
           {R"({"axes_dims_rope": [31, 33, 32, 32]})", "even"},
           {R"({"num_layers": 1099511627776})", "num_layers"},
           {R"({"mlp_ratio": 0})", "mlp_ratio"},
           {R"({"rope_theta": -1})", "rope_theta"},
           {R"({"eps": 0})", "eps"},
           {R"({"guidance_embeds": 1})", "guidance_embeds"},
           {R"({"num_attention_heads": 0})", "num_attention_heads"},
           {R"({"timestep_guidance_channels": 255})", "timestep_guidance_channels"},
       }) {
    const std::string msg = config_error(json);
    EXPECT_NE(msg.find("transformer/config.json"), std::string::npos) << json << " -> " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << json << " -> " << msg;
  }
}

TEST(Flux2Transformer, ForwardRejectsBadInputs) {
  const StepInputs dev = flux2_step0_inputs("dev_64x64_s0");
  auto model = load(dev.pipeline, float32);
  auto expect_error = [&](StepInputs in, const std::string& needle) {
    try {
      run(*model, in);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("Flux2Transformer2DModel"), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  };
  StepInputs in = dev;
  in.hidden = Tensor::zeros({1, 16, 31});
  expect_error(in, "hidden_states");
  in = dev;
  in.hidden = dev.hidden.to(bfloat16);
  expect_error(in, "bfloat16");
  in = dev;
  in.encoder_hidden = Tensor::zeros({1, 12, 47});
  expect_error(in, "encoder_hidden_states");
  in = dev;
  in.timestep = Tensor::zeros({1, 1});
  expect_error(in, "timestep");
  in = dev;
  in.guidance = Tensor::zeros({2});
  expect_error(in, "guidance");
  in = dev;
  in.img_ids = models::flux2_latent_ids(4, 3);
  expect_error(in, "img_ids");
  in = dev;
  in.txt_ids = Tensor::zeros({12, 3});
  expect_error(in, "txt_ids");

  Flux2Transformer2DModel unloaded(model->config());
  try {
    run(unloaded, dev);
    ADD_FAILURE() << "an unloaded model ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("load_weights"), std::string::npos) << e.what();
  }
  // A compiled forward cannot fill a trace.
  model->compile();
  models::Flux2TransformerTrace trace;
  EXPECT_THROW(run(*model, dev, &trace), Error);
}

TEST(Flux2Transformer, PositionIdsAreThePipelines) {
  // The goldens hold the ids diffusers built (int64): latents, text, and reference images at t = 10, 20.
  io::SafetensorsFile g(testing::data_path("goldens/flux2/dev_ref2_auto_s11.safetensors"));
  EXPECT_TRUE(testing::all_close(models::flux2_latent_ids(4, 6), g.tensor("latent_ids").to(float32), 0, 0));
  EXPECT_TRUE(testing::all_close(models::flux2_text_ids(16),
                                 g.tensor("transformer_in_txt_ids").select(0, 0).to(float32), 0, 0));
  // ref_b (100x64 -> 96x64: a 4x6 grid) then ref_a (72x88 -> 64x80: a 5x4 grid).
  EXPECT_TRUE(testing::all_close(models::flux2_image_ids({{4, 6}, {5, 4}}),
                                 g.tensor("image_latent_ids").to(float32), 0, 0));
  EXPECT_EQ(models::flux2_text_ids(3).to_vector<float>(),
            (std::vector<float>{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2}));
  EXPECT_THROW(models::flux2_latent_ids(0, 4), Error);
  EXPECT_THROW(models::flux2_image_ids({}), Error);
}

}  // namespace
}  // namespace kiln
