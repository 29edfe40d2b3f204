// The LoRA layouts' names and the layers they reach (kiln/lora/lora_keys.h), as diffusers' converters map
// them.
#include <gtest/gtest.h>

#include "kiln/core/error.h"
#include "kiln/lora/lora_keys.h"
#include "kiln/pipelines/pipeline_registry.h"

namespace kiln::lora {
namespace {

// The registered family's LoRA descriptor.
const LoraFamily& lora_family(const std::string& name) {
  for (const Family& f : families())
    if (f.name == name && f.lora) return *f.lora;
  throw Error("no family " + name + " that takes LoRA");
}

std::vector<std::string> pair_of(const std::string& module, const char* down = ".lora_A.weight",
                                 const char* up = ".lora_B.weight") {
  return {module + down, module + up};
}

std::vector<std::string> targets_of(const LoraPairKeys& p) {
  std::vector<std::string> out;
  for (const LoraTarget& t : p.targets) out.push_back(t.component + ":" + t.module);
  return out;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LoraKeys, DetectsEachLayout) {
  EXPECT_EQ(detect_lora_format(pair_of("transformer.x_embedder")), LoraFormat::Diffusers);
  EXPECT_EQ(detect_lora_format(pair_of("lora_unet_img_in", ".lora_down.weight", ".lora_up.weight")),
            LoraFormat::Kohya);
  EXPECT_EQ(detect_lora_format(pair_of("diffusion_model.double_blocks.0.img_attn.qkv")),
            LoraFormat::BlackForestLabs);
  EXPECT_EQ(
      detect_lora_format(pair_of("double_blocks.0.img_attn.qkv", ".lora_down.weight", ".lora_up.weight")),
      LoraFormat::BlackForestLabs);
  EXPECT_EQ(detect_lora_format(pair_of("double_blocks.0.processor.qkv_lora1", ".down.weight", ".up.weight")),
            LoraFormat::XLabs);
  // A model checkpoint is no LoRA file.
  EXPECT_EQ(detect_lora_format({"x_embedder.weight", "x_embedder.bias"}), std::nullopt);
  EXPECT_NE(
      error_of([] { plan_lora_keys({"x_embedder.weight"}, lora_family("FLUX.1")); }).find("not a LoRA file"),
      std::string::npos);
}

TEST(LoraKeys, KohyaFusedLayersSplitAsDiffusersDoes) {
  std::vector<std::string> names;
  for (const char* m :
       {"lora_unet_double_blocks_12_img_attn_qkv", "lora_unet_single_blocks_3_linear1",
        "lora_unet_final_layer_adaLN_modulation_1", "lora_te1_text_model_encoder_layers_4_self_attn_q_proj",
        "lora_te1_text_model_encoder_layers_0_mlp_fc2"}) {
    for (const std::string& n : pair_of(m, ".lora_down.weight", ".lora_up.weight")) names.push_back(n);
    names.push_back(std::string(m) + ".alpha");
  }
  const LoraKeys flux1 = plan_lora_keys(names, lora_family("FLUX.1"));
  ASSERT_EQ(flux1.pairs.size(), 5u);
  EXPECT_TRUE(flux1.unknown.empty() && flux1.skipped.empty());
  EXPECT_EQ(targets_of(flux1.pairs[0]),
            (std::vector<std::string>{"transformer:transformer_blocks.12.attn.to_q",
                                      "transformer:transformer_blocks.12.attn.to_k",
                                      "transformer:transformer_blocks.12.attn.to_v"}));
  EXPECT_EQ(flux1.pairs[0].alpha, "lora_unet_double_blocks_12_img_attn_qkv.alpha");
  EXPECT_EQ(targets_of(flux1.pairs[1]),
            (std::vector<std::string>{"transformer:single_transformer_blocks.3.attn.to_q",
                                      "transformer:single_transformer_blocks.3.attn.to_k",
                                      "transformer:single_transformer_blocks.3.attn.to_v",
                                      "transformer:single_transformer_blocks.3.proj_mlp"}));
  EXPECT_EQ(targets_of(flux1.pairs[2]), std::vector<std::string>{"transformer:norm_out.linear"});
  EXPECT_TRUE(flux1.pairs[2].swap_up_halves);
  EXPECT_EQ(targets_of(flux1.pairs[3]),
            std::vector<std::string>{"text_encoder:text_model.encoder.layers.4.self_attn.q_proj"});
  EXPECT_EQ(targets_of(flux1.pairs[4]),
            std::vector<std::string>{"text_encoder:text_model.encoder.layers.0.mlp.fc2"});

  // FLUX.2 keeps linear1 fused and loads no text-encoder LoRA (diffusers' FLUX.2 loader skips it).
  const LoraKeys flux2 = plan_lora_keys(names, lora_family("FLUX.2"));
  ASSERT_EQ(flux2.pairs.size(), 3u);
  EXPECT_EQ(targets_of(flux2.pairs[1]),
            std::vector<std::string>{"transformer:single_transformer_blocks.3.attn.to_qkv_mlp_proj"});
  EXPECT_EQ(flux2.skipped.size(), 6u);
}

TEST(LoraKeys, BlackForestLabsAndXLabsNames) {
  std::vector<std::string> names;
  for (const char* m :
       {"diffusion_model.double_blocks.0.txt_attn.qkv", "diffusion_model.double_blocks.1.img_mlp.2",
        "base_model.model.single_blocks.0.modulation.lin", "diffusion_model.img_in",
        "diffusion_model.time_in.out_layer"})
    for (const std::string& n : pair_of(m)) names.push_back(n);
  const LoraKeys bfl = plan_lora_keys(names, lora_family("FLUX.1"));
  EXPECT_EQ(bfl.format, LoraFormat::BlackForestLabs);
  ASSERT_EQ(bfl.pairs.size(), 5u);
  EXPECT_EQ(targets_of(bfl.pairs[0]).back(), "transformer:transformer_blocks.0.attn.add_v_proj");
  EXPECT_EQ(targets_of(bfl.pairs[1]), std::vector<std::string>{"transformer:transformer_blocks.1.ff.net.2"});
  EXPECT_EQ(targets_of(bfl.pairs[2]),
            std::vector<std::string>{"transformer:single_transformer_blocks.0.norm.linear"});
  EXPECT_EQ(targets_of(bfl.pairs[3]), std::vector<std::string>{"transformer:x_embedder"});
  EXPECT_EQ(targets_of(bfl.pairs[4]),
            std::vector<std::string>{"transformer:time_text_embed.timestep_embedder.linear_2"});
  const LoraKeys bfl2 = plan_lora_keys(names, lora_family("FLUX.2"));
  ASSERT_EQ(bfl2.pairs.size(), 4u);
  EXPECT_EQ(targets_of(bfl2.pairs[1]),
            std::vector<std::string>{"transformer:transformer_blocks.1.ff.linear_out"});
  EXPECT_EQ(targets_of(bfl2.pairs[3]),
            std::vector<std::string>{"transformer:time_guidance_embed.timestep_embedder.linear_2"});
  // FLUX.2 blocks have no modulation of their own.
  ASSERT_EQ(bfl2.unknown.size(), 1u);
  EXPECT_EQ(bfl2.unknown[0].first, "base_model.model.single_blocks.0.modulation.lin.lora_A.weight");

  const LoraKeys xlabs = plan_lora_keys(
      {"double_blocks.2.processor.qkv_lora2.down.weight", "double_blocks.2.processor.qkv_lora2.up.weight",
       "single_blocks.5.processor.proj_lora.down.weight", "single_blocks.5.processor.proj_lora.up.weight"},
      lora_family("FLUX.1"));
  EXPECT_EQ(xlabs.format, LoraFormat::XLabs);
  ASSERT_EQ(xlabs.pairs.size(), 2u);
  EXPECT_EQ(targets_of(xlabs.pairs[0]),
            (std::vector<std::string>{"transformer:transformer_blocks.2.attn.add_q_proj",
                                      "transformer:transformer_blocks.2.attn.add_k_proj",
                                      "transformer:transformer_blocks.2.attn.add_v_proj"}));
  EXPECT_EQ(targets_of(xlabs.pairs[1]),
            std::vector<std::string>{"transformer:single_transformer_blocks.5.proj_out"});
}

TEST(LoraKeys, DiffusersComponentsPerFamily) {
  std::vector<std::string> names;
  for (const char* m :
       {"transformer.transformer_blocks.0.attn.to_q", "text_encoder.text_model.encoder.layers.0.mlp.fc1",
        "text_encoder_2.text_model.encoder.layers.1.self_attn.k_proj"})
    for (const std::string& n : pair_of(m)) names.push_back(n);
  names.push_back("transformer.transformer_blocks.0.attn.to_q.alpha");
  const LoraKeys sd3 = plan_lora_keys(names, lora_family("SD3"));
  ASSERT_EQ(sd3.pairs.size(), 3u);
  EXPECT_EQ(sd3.pairs[0].alpha, "transformer.transformer_blocks.0.attn.to_q.alpha");
  EXPECT_EQ(targets_of(sd3.pairs[2]),
            std::vector<std::string>{"text_encoder_2:text_model.encoder.layers.1.self_attn.k_proj"});
  // FluxPipeline loads no LoRA into T5, FLUX.2 none into its text encoder: skipped, as diffusers skips them.
  const LoraKeys flux1 = plan_lora_keys(names, lora_family("FLUX.1"));
  EXPECT_EQ(flux1.pairs.size(), 2u);
  EXPECT_EQ(flux1.skipped.size(), 2u);
  const LoraKeys flux2 = plan_lora_keys(names, lora_family("FLUX.2"));
  EXPECT_EQ(flux2.pairs.size(), 1u);
  // Another component is unknown, named.
  const LoraKeys unet = plan_lora_keys(pair_of("unet.down_blocks.0.proj"), lora_family("SD3"));
  ASSERT_EQ(unet.unknown.size(), 1u);
  EXPECT_NE(unet.unknown[0].second.find("component 'unet'"), std::string::npos) << unet.unknown[0].second;
}

TEST(LoraKeys, WhatDoesNotFitIsNamedInFileOrder) {
  const LoraKeys keys = plan_lora_keys(
      {"lora_unet_double_blocks_0_img_attn_proj.lora_down.weight",
       "lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", "lora_unet_mystery.lora_down.weight",
       "lora_unet_mystery.lora_up.weight", "lora_unet_single_blocks_1_linear2.lora_down.weight",
       "lora_unet_double_blocks_0_img_attn_qkv.dora_scale", "lora_te2_encoder_block_0_q.lora_down.weight",
       "lora_te2_encoder_block_0_q.lora_up.weight", "lora_unet_img_in.weight"},
      lora_family("FLUX.1"));
  ASSERT_EQ(keys.pairs.size(), 1u);
  ASSERT_EQ(keys.unknown.size(), 3u);
  EXPECT_EQ(keys.unknown[0].first, "lora_unet_mystery.lora_down.weight");
  EXPECT_NE(keys.unknown[0].second.find("not a module of the FLUX.1 transformer"), std::string::npos);
  EXPECT_EQ(keys.unknown[1].first, "lora_unet_single_blocks_1_linear2.lora_down.weight");
  EXPECT_NE(keys.unknown[1].second.find("no up"), std::string::npos);
  EXPECT_EQ(keys.unknown[2].first, "lora_unet_img_in.weight");
  ASSERT_EQ(keys.skipped.size(), 3u);
  EXPECT_NE(keys.skipped[0].second.find("DoRA"), std::string::npos);
}

TEST(LoraKeys, LayoutsAFamilyDoesNotTakeAndTensorsKilnDoesNotRunAreRefused) {
  const auto kohya = pair_of("lora_unet_img_in", ".lora_down.weight", ".lora_up.weight");
  EXPECT_NE(error_of([&] {
              plan_lora_keys(kohya, lora_family("SD3"));
            }).find("kohya (sd-scripts) layout are not for SD3"),
            std::string::npos);
  const auto xlabs = pair_of("double_blocks.0.processor.proj_lora1", ".down.weight", ".up.weight");
  EXPECT_NE(error_of([&] { plan_lora_keys(xlabs, lora_family("FLUX.2")); }).find("XLabs"), std::string::npos);
  auto dora = pair_of("transformer.proj_out");
  dora.push_back("transformer.proj_out.lora_magnitude_vector");
  EXPECT_NE(error_of([&] { plan_lora_keys(dora, lora_family("FLUX.1")); }).find("DoRA"), std::string::npos);
  auto bias = pair_of("transformer.proj_out");
  bias.push_back("transformer.proj_out.lora_B.bias");
  EXPECT_NE(error_of([&] { plan_lora_keys(bias, lora_family("FLUX.1")); }).find("biases"), std::string::npos);
}

// kohya's names for Stable Diffusion (diffusers' _maybe_map_sgm_blocks_to_diffusers and
// _convert_non_diffusers_lora_to_diffusers), planned with the registered family (a UNet of 2 ResNets a
// level).
std::vector<std::string> sd_targets(const std::string& kohya_module) {
  const LoraKeys keys = plan_lora_keys(pair_of(kohya_module, ".lora_down.weight", ".lora_up.weight"),
                                       lora_family("Stable Diffusion"));
  EXPECT_EQ(keys.format, LoraFormat::Kohya);
  if (keys.pairs.size() != 1) return {"unknown: " + (keys.unknown.empty() ? "" : keys.unknown[0].second)};
  return targets_of(keys.pairs[0]);
}

using Targets = std::vector<std::string>;

TEST(LoraKeys, KohyaStableDiffusionUNetInDiffusersNames) {
  EXPECT_EQ(sd_targets("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"),
            Targets{"unet:down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"});
  EXPECT_EQ(sd_targets("lora_unet_up_blocks_3_attentions_2_transformer_blocks_0_attn2_to_out_0"),
            Targets{"unet:up_blocks.3.attentions.2.transformer_blocks.0.attn2.to_out.0"});
  EXPECT_EQ(sd_targets("lora_unet_mid_block_attentions_0_transformer_blocks_0_ff_net_0_proj"),
            Targets{"unet:mid_block.attentions.0.transformer_blocks.0.ff.net.0.proj"});
  EXPECT_EQ(sd_targets("lora_unet_down_blocks_1_attentions_1_transformer_blocks_0_ff_net_2"),
            Targets{"unet:down_blocks.1.attentions.1.transformer_blocks.0.ff.net.2"});
  EXPECT_EQ(sd_targets("lora_unet_down_blocks_1_attentions_0_proj_in"),
            Targets{"unet:down_blocks.1.attentions.0.proj_in"});
  EXPECT_EQ(sd_targets("lora_unet_mid_block_attentions_0_proj_out"),
            Targets{"unet:mid_block.attentions.0.proj_out"});
  EXPECT_EQ(sd_targets("lora_unet_down_blocks_0_resnets_1_time_emb_proj"),
            Targets{"unet:down_blocks.0.resnets.1.time_emb_proj"});
  EXPECT_EQ(sd_targets("lora_unet_time_embedding_linear_1"), Targets{"unet:time_embedding.linear_1"});
  // Not a module of the UNet: named.
  EXPECT_NE(sd_targets("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn3_to_q")[0].find(
                "not a module of the Stable Diffusion unet"),
            std::string::npos);
}

TEST(LoraKeys, KohyaStableDiffusionUNetInSgmNames) {
  // input_blocks.i: level (i-1)/3, layer (i-1)%3 with 2 ResNets a level; middle_block.1: the attention;
  // output_blocks.i: level i/3, layer i%3.
  EXPECT_EQ(sd_targets("lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q"),
            Targets{"unet:down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q"});
  EXPECT_EQ(sd_targets("lora_unet_input_blocks_8_1_transformer_blocks_1_attn2_to_k"),
            Targets{"unet:down_blocks.2.attentions.1.transformer_blocks.1.attn2.to_k"});
  EXPECT_EQ(sd_targets("lora_unet_middle_block_1_transformer_blocks_0_ff_net_2"),
            Targets{"unet:mid_block.attentions.0.transformer_blocks.0.ff.net.2"});
  EXPECT_EQ(sd_targets("lora_unet_middle_block_1_proj_in"), Targets{"unet:mid_block.attentions.0.proj_in"});
  EXPECT_EQ(sd_targets("lora_unet_output_blocks_0_1_transformer_blocks_0_attn1_to_out_0"),
            Targets{"unet:up_blocks.0.attentions.0.transformer_blocks.0.attn1.to_out.0"});
  EXPECT_EQ(sd_targets("lora_unet_output_blocks_5_1_proj_out"),
            Targets{"unet:up_blocks.1.attentions.2.proj_out"});
  EXPECT_EQ(sd_targets("lora_unet_input_blocks_1_0_emb_layers_1"),
            Targets{"unet:down_blocks.0.resnets.0.time_emb_proj"});
  EXPECT_EQ(sd_targets("lora_unet_time_embed_2"), Targets{"unet:time_embedding.linear_2"});
  EXPECT_EQ(sd_targets("lora_unet_label_emb_0_0"), Targets{"unet:add_embedding.linear_1"});
  // input_blocks.3 is level 0's downsampler, not an attention.
  EXPECT_NE(sd_targets("lora_unet_input_blocks_3_1_proj_in")[0].find("not a module"), std::string::npos);
}

TEST(LoraKeys, KohyaStableDiffusionTextEncoders) {
  EXPECT_EQ(sd_targets("lora_te_text_model_encoder_layers_0_self_attn_q_proj"),
            Targets{"text_encoder:text_model.encoder.layers.0.self_attn.q_proj"});
  EXPECT_EQ(sd_targets("lora_te1_text_model_encoder_layers_11_mlp_fc1"),
            Targets{"text_encoder:text_model.encoder.layers.11.mlp.fc1"});
  // SDXL's second CLIP (OpenCLIP bigG), not a T5.
  EXPECT_EQ(sd_targets("lora_te2_text_model_encoder_layers_31_self_attn_out_proj"),
            Targets{"text_encoder_2:text_model.encoder.layers.31.self_attn.out_proj"});
  // FLUX.1's lora_te2_ stays T5's, which diffusers skips.
  const LoraKeys flux = plan_lora_keys(
      pair_of("lora_te2_encoder_block_0_layer_0_SelfAttention_q", ".lora_down.weight", ".lora_up.weight"),
      lora_family("FLUX.1"));
  EXPECT_TRUE(flux.pairs.empty());
  ASSERT_EQ(flux.skipped.size(), 2u);
  EXPECT_NE(flux.skipped[0].second.find("T5"), std::string::npos);
}

// LoCon files' convolutions and the ResNets' and embeddings' Linears, in diffusers' flat names (SD1.x) and
// SGM's (SDXL), as diffusers' _maybe_map_sgm_blocks_to_diffusers and _convert_unet_lora_key name them.
TEST(LoraKeys, KohyaStableDiffusionConvolutions) {
  for (const auto& [kohya, module] : std::vector<std::pair<std::string, std::string>>{
           {"lora_unet_conv_in", "conv_in"},
           {"lora_unet_conv_out", "conv_out"},
           {"lora_unet_down_blocks_0_resnets_0_conv1", "down_blocks.0.resnets.0.conv1"},
           {"lora_unet_up_blocks_2_resnets_1_conv_shortcut", "up_blocks.2.resnets.1.conv_shortcut"},
           {"lora_unet_down_blocks_1_downsamplers_0_conv", "down_blocks.1.downsamplers.0.conv"},
           {"lora_unet_up_blocks_0_upsamplers_0_conv", "up_blocks.0.upsamplers.0.conv"},
           {"lora_unet_mid_block_resnets_1_conv2", "mid_block.resnets.1.conv2"},
           {"lora_unet_input_blocks_0_0", "conv_in"},
           {"lora_unet_out_2", "conv_out"},
           {"lora_unet_input_blocks_1_0_in_layers_2", "down_blocks.0.resnets.0.conv1"},
           {"lora_unet_input_blocks_5_0_out_layers_3", "down_blocks.1.resnets.1.conv2"},
           {"lora_unet_input_blocks_4_0_skip_connection", "down_blocks.1.resnets.0.conv_shortcut"},
           {"lora_unet_input_blocks_4_0_emb_layers_1", "down_blocks.1.resnets.0.time_emb_proj"},
           {"lora_unet_input_blocks_3_0_op", "down_blocks.0.downsamplers.0.conv"},
           {"lora_unet_middle_block_0_in_layers_2", "mid_block.resnets.0.conv1"},
           {"lora_unet_middle_block_2_out_layers_3", "mid_block.resnets.1.conv2"},
           {"lora_unet_output_blocks_0_0_skip_connection", "up_blocks.0.resnets.0.conv_shortcut"},
           {"lora_unet_output_blocks_2_1_conv", "up_blocks.0.upsamplers.0.conv"},
           {"lora_unet_time_embed_0", "time_embedding.linear_1"}})
    EXPECT_EQ(sd_targets(kohya), Targets{"unet:" + module}) << kohya;
}

}  // namespace
}  // namespace kiln::lora
