// SD1.x, SDXL and SDXL refiner single files in the original Stability layout: tests/data/goldens/
// sd_single_file/ holds the tiny folders sd15-tiny, sdxl-tiny and sdxl-refiner-tiny written as one file each
// (tools/goldens/sd_single_file.py, which proves with diffusers' from_single_file that the file holds exactly
// the folder's weights). Loaded through
// the single-file views, every parameter of the UNet, text encoder(s) and VAE must equal the folder's; files
// of other kinds must be refused by name.
#include <gtest/gtest.h>

#include "families/stable_diffusion/sd_single_file.h"
#include "io/io_test_util.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using models::StableDiffusionSingleFile;
using Kind = StableDiffusionSingleFile::Kind;

std::string single_file(const std::string& name) {
  return testing::data_path("goldens/sd_single_file/" + name + ".safetensors");
}

std::string folder(const std::string& model, const std::string& component) {
  return testing::data_path("models/" + model + "/" + component);
}

// Every parameter of `got` equals the same-named one of `want`, value for value (the file is float32 like
// the folder, and the views only rename, split, reshape and transpose).
void expect_same_parameters(nn::Module& got, nn::Module& want, const std::string& what) {
  const auto got_params = got.named_parameters();
  const auto want_params = want.named_parameters();
  ASSERT_EQ(got_params.size(), want_params.size()) << what;
  for (size_t i = 0; i < want_params.size(); ++i) {
    ASSERT_EQ(got_params[i].first, want_params[i].first) << what;
    const Tensor& g = *got_params[i].second;
    const Tensor& w = *want_params[i].second;
    ASSERT_EQ(g.shape(), w.shape()) << what << ": " << want_params[i].first;
    EXPECT_EQ(g.to_vector<float>(), w.to_vector<float>()) << what << ": " << want_params[i].first;
  }
}

void expect_unet_equals_folder(const nn::WeightSource& view, const std::string& model) {
  models::UNet2DConditionModel got(models::UNet2DConditionConfig::from_file(folder(model, "unet")));
  got.load_weights(view);
  auto want = models::load_unet_2d_condition(folder(model, "unet"), float32);
  expect_same_parameters(got, *want, model + " unet");
}

void expect_clip_equals_folder(const nn::WeightSource& view, const std::string& model,
                               const std::string& component) {
  models::ClipTextModel got(models::ClipTextConfig::from_file(folder(model, component) + "/config.json"));
  got.load_weights(view);
  auto want = models::load_clip_text_model(folder(model, component), float32);
  expect_same_parameters(got, *want, model + " " + component);
}

void expect_vae_equals_folder(const nn::WeightSource& view, const std::string& model) {
  models::AutoencoderKL got(models::AutoencoderKLConfig::from_file(folder(model, "vae") + "/config.json"));
  got.load_weights(view);
  auto want = models::load_autoencoder_kl(folder(model, "vae"), float32);
  expect_same_parameters(got, *want, model + " vae");
}

// The tensors of `path` (all, or those under `prefix`), with `extra` added.
std::vector<std::pair<std::string, Tensor>> tensors_of(
    const std::string& path, const std::string& prefix = "",
    std::vector<std::pair<std::string, Tensor>> extra = {}) {
  const io::SafetensorsFile f(path);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& n : f.names())
    if (n.rfind(prefix, 0) == 0) out.emplace_back(n, f.tensor(n));
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

std::string write(const std::string& name, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  const std::string path = testing::temp_dir("sd_single_file_" + name) + "/" + name + ".safetensors";
  io::save_safetensors(path, tensors);
  return path;
}

Tensor zeros_of(const Shape& shape) {
  return testing::values(shape, 1, 0.0, 0.0);
}

TEST(StableDiffusionSingleFile, Sd15FileEqualsTheFolder) {
  // The file carries what real SD1.x files carry beside the weights, which must be ignored, not refused.
  const io::SafetensorsFile raw(single_file("sd15_tiny"));
  for (const char* buffer : {"alphas_cumprod", "betas", "model_ema.decay",
                             "cond_stage_model.transformer.text_model.embeddings.position_ids"})
    ASSERT_TRUE(raw.contains(buffer)) << buffer;

  const StableDiffusionSingleFile sf = models::open_stable_diffusion_single_file(single_file("sd15_tiny"));
  EXPECT_EQ(sf.kind, Kind::SD1);
  EXPECT_STREQ(models::kind_name(sf.kind), "SD1.x");
  EXPECT_EQ(sf.in_channels, 4);
  EXPECT_EQ(sf.cross_attention_dim, 32);
  EXPECT_EQ(sf.layers_per_block, 2);
  EXPECT_EQ(sf.block_out_channels, (std::vector<int64_t>{16, 24, 32}));
  ASSERT_TRUE(sf.unet && sf.text_encoder && sf.vae);
  EXPECT_EQ(sf.text_encoder_2, nullptr);
  // ldm's 1x1-conv attention weight, seen as the Linear's matrix.
  EXPECT_EQ(sf.vae->shape("decoder.mid_block.attentions.0.to_q.weight"), (Shape{16, 16}));
  expect_unet_equals_folder(*sf.unet, "sd15-tiny");
  expect_clip_equals_folder(*sf.text_encoder, "sd15-tiny", "text_encoder");
  expect_vae_equals_folder(*sf.vae, "sd15-tiny");
}

TEST(StableDiffusionSingleFile, SdxlFileEqualsTheFolder) {
  const StableDiffusionSingleFile sf = models::open_stable_diffusion_single_file(single_file("sdxl_tiny"));
  EXPECT_EQ(sf.kind, Kind::SDXL);
  EXPECT_EQ(sf.in_channels, 4);
  EXPECT_EQ(sf.cross_attention_dim, 64);
  EXPECT_EQ(sf.layers_per_block, 2);
  EXPECT_EQ(sf.block_out_channels, (std::vector<int64_t>{16, 24, 32}));
  ASSERT_TRUE(sf.unet && sf.text_encoder && sf.text_encoder_2 && sf.vae);
  // OpenCLIP stores text_projection as [width 32, projection 24]; the Linear holds [24, 32].
  EXPECT_EQ(sf.text_encoder_2->shape("text_projection.weight"), (Shape{24, 32}));
  // bigG's fused in_proj rows split into q, k and v of the width each.
  EXPECT_EQ(sf.text_encoder_2->shape("text_model.encoder.layers.1.self_attn.v_proj.weight"), (Shape{32, 32}));
  expect_unet_equals_folder(*sf.unet, "sdxl-tiny");
  expect_clip_equals_folder(*sf.text_encoder, "sdxl-tiny", "text_encoder");
  expect_clip_equals_folder(*sf.text_encoder_2, "sdxl-tiny", "text_encoder_2");
  expect_vae_equals_folder(*sf.vae, "sdxl-tiny");
}

TEST(StableDiffusionSingleFile, UnetOnlyFilesHaveNoOtherComponents) {
  const StableDiffusionSingleFile sd15 =
      models::open_stable_diffusion_single_file(single_file("sd15_tiny_unet_only"));
  EXPECT_EQ(sd15.kind, Kind::SD1);
  ASSERT_TRUE(sd15.unet);
  EXPECT_EQ(sd15.text_encoder, nullptr);
  EXPECT_EQ(sd15.text_encoder_2, nullptr);
  EXPECT_EQ(sd15.vae, nullptr);
  expect_unet_equals_folder(*sd15.unet, "sd15-tiny");

  // An SDXL UNet alone is told from SD1.x by its added-condition embedding (label_emb).
  const std::string xl = write("xl_unet", tensors_of(single_file("sdxl_tiny"), "model.diffusion_model."));
  const StableDiffusionSingleFile sdxl = models::open_stable_diffusion_single_file(xl);
  EXPECT_EQ(sdxl.kind, Kind::SDXL);
  EXPECT_EQ(sdxl.text_encoder, nullptr);
  EXPECT_EQ(sdxl.vae, nullptr);
  expect_unet_equals_folder(*sdxl.unet, "sdxl-tiny");
}

TEST(StableDiffusionSingleFile, AMissingTensorIsNamedWithItsComponent) {
  auto tensors = tensors_of(single_file("sd15_tiny"));
  std::erase_if(tensors, [](const auto& t) {
    return t.first == "model.diffusion_model.output_blocks.5.2.conv.weight";
  });
  const StableDiffusionSingleFile sf = models::open_stable_diffusion_single_file(write("missing", tensors));
  models::UNet2DConditionModel unet(models::UNet2DConditionConfig::from_file(folder("sd15-tiny", "unet")));
  EXPECT_KILN_ERROR(unet.load_weights(*sf.unet), "missing.safetensors (its unet)",
                    "up_blocks.1.upsamplers.0.conv.weight");
}

// SD2.x as Stability ships it (v2-1_768-ema-pruned.safetensors): OpenCLIP-H at cond_stage_model.model (with
// the projection and logit_scale SD2's CLIPTextModel has no parameter for), linear projections in the UNet;
// the tiny SD 2.1 written so (tools/goldens/sd_single_file.py, checked there against diffusers'
// from_single_file) equals its folder.
TEST(StableDiffusionSingleFile, Sd2FileEqualsTheFolder) {
  const StableDiffusionSingleFile sf = models::open_stable_diffusion_single_file(single_file("sd2_tiny"));
  EXPECT_EQ(sf.kind, Kind::SD2);
  EXPECT_STREQ(models::kind_name(sf.kind), "SD2.x");
  EXPECT_STREQ(models::single_file_class(sf.kind, false), "StableDiffusionPipeline");
  EXPECT_STREQ(models::single_file_class(sf.kind, true), "StableDiffusionInpaintPipeline");
  EXPECT_STREQ(models::default_config(sf.kind), "stabilityai/stable-diffusion-2-1");
  EXPECT_STREQ(models::default_config(sf.kind, true), "stabilityai/stable-diffusion-2-inpainting");
  ASSERT_TRUE(sf.unet && sf.text_encoder && sf.vae);
  EXPECT_EQ(sf.text_encoder_2, nullptr);
  EXPECT_FALSE(sf.text_encoder->contains("text_projection.weight"));
  expect_unet_equals_folder(*sf.unet, "sd2-tiny");
  expect_clip_equals_folder(*sf.text_encoder, "sd2-tiny", "text_encoder");
  expect_vae_equals_folder(*sf.vae, "sd2-tiny");

  // A UNet alone: SD2's 1024-wide context gives it away (diffusers' "v2"); here the tiny UNet's
  // cross-attention keys and values are widened to 1024 (the reader reads shapes only), and at its own 32 it
  // reads as SD1.x.
  std::vector<std::pair<std::string, Tensor>> unet;
  for (auto& [name, t] : tensors_of(single_file("sd2_tiny"), "model.diffusion_model.")) {
    const bool kv = name.find(".attn2.to_k.weight") != std::string::npos ||
                    name.find(".attn2.to_v.weight") != std::string::npos;
    unet.emplace_back(name, kv ? zeros_of({t.size(0), 1024}) : t);
  }
  const StableDiffusionSingleFile alone = models::open_stable_diffusion_single_file(write("sd2_unet", unet));
  EXPECT_EQ(alone.kind, Kind::SD2);
  EXPECT_EQ(alone.text_encoder, nullptr);
  EXPECT_EQ(models::open_stable_diffusion_single_file(
                write("sd2_unet_32", tensors_of(single_file("sd2_tiny"), "model.diffusion_model.")))
                .kind,
            Kind::SD1);
  // An SD2 file with a CLIP-L beside OpenCLIP-H is no SD2 file: the stray tower is named.
  auto tensors = tensors_of(single_file("sd2_tiny"));
  tensors.emplace_back("cond_stage_model.transformer.text_model.final_layer_norm.weight", zeros_of({32}));
  EXPECT_KILN_ERROR(models::open_stable_diffusion_single_file(write("sd2_two_towers", tensors)),
                    "an SD2.x single file",
                    "cond_stage_model.transformer.text_model.final_layer_norm.weight");
}

// The refiner as Stability ships it (sd_xl_refiner_1.0.safetensors): OpenCLIP bigG alone at
// conditioner.embedders.0.model, no CLIP-L; the tiny refiner written so (tools/goldens/sd_single_file.py,
// checked there against diffusers' from_single_file) equals its folder.
TEST(StableDiffusionSingleFile, SdxlRefinerFileEqualsTheFolder) {
  const StableDiffusionSingleFile sf =
      models::open_stable_diffusion_single_file(single_file("sdxl_refiner_tiny"));
  EXPECT_EQ(sf.kind, Kind::SDXLRefiner);
  EXPECT_STREQ(models::kind_name(sf.kind), "SDXL refiner");
  EXPECT_STREQ(models::single_file_class(sf.kind, false), "StableDiffusionXLImg2ImgPipeline");
  EXPECT_STREQ(models::default_config(sf.kind), "stabilityai/stable-diffusion-xl-refiner-1.0");
  EXPECT_EQ(sf.in_channels, 4);
  EXPECT_EQ(sf.cross_attention_dim, 32);  // the one tower's width
  EXPECT_EQ(sf.block_out_channels, (std::vector<int64_t>{16, 24, 32}));
  ASSERT_TRUE(sf.unet && sf.text_encoder_2 && sf.vae);
  EXPECT_EQ(sf.text_encoder, nullptr);
  EXPECT_EQ(sf.text_encoder_2->shape("text_projection.weight"), (Shape{24, 32}));
  expect_unet_equals_folder(*sf.unet, "sdxl-refiner-tiny");
  expect_clip_equals_folder(*sf.text_encoder_2, "sdxl-refiner-tiny", "text_encoder_2");
  expect_vae_equals_folder(*sf.vae, "sdxl-refiner-tiny");

  // The refiner's UNet alone is told from the base's by its context: bigG's 1280 wide (the base's 2048). Here
  // the tiny UNet's cross-attention keys and values are widened to 1280 (the reader reads shapes only).
  std::vector<std::pair<std::string, Tensor>> unet;
  for (auto& [name, t] : tensors_of(single_file("sdxl_refiner_tiny"), "model.diffusion_model.")) {
    const bool kv = name.find(".attn2.to_k.weight") != std::string::npos ||
                    name.find(".attn2.to_v.weight") != std::string::npos;
    unet.emplace_back(name, kv ? zeros_of({t.size(0), 1280}) : t);
  }
  const StableDiffusionSingleFile alone =
      models::open_stable_diffusion_single_file(write("refiner_unet", unet));
  EXPECT_EQ(alone.kind, Kind::SDXLRefiner);
  EXPECT_EQ(alone.cross_attention_dim, 1280);
  EXPECT_EQ(alone.text_encoder_2, nullptr);

  // A refiner file with CLIP-L beside its bigG is no refiner: the stray tower is named.
  const std::string with_clip_l = write(
      "refiner_clip_l", tensors_of(single_file("sdxl_refiner_tiny"), "",
                                   {{"conditioner.embedders.0.transformer.text_model.final_layer_norm.weight",
                                     zeros_of({32})}}));
  EXPECT_KILN_ERROR(models::open_stable_diffusion_single_file(with_clip_l), "refiner_clip_l.safetensors",
                    "an SDXL refiner single file with 1 tensors",
                    "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight");
}

// Inpainting UNets (9 input channels: the latents, the mask and the masked image's latents) are read like
// the others: the tiny SD1.5 inpainting UNet alone (tools/goldens/sd_inpaint9.py) equals its folder's, and an
// SDXL file whose conv_in takes 9 channels is an SDXL one of 9. Other counts are refused naming them.
TEST(StableDiffusionSingleFile, InpaintingUnetsAreRead) {
  const StableDiffusionSingleFile sd15 =
      models::open_stable_diffusion_single_file(single_file("sd15_inpaint_tiny_unet_only"));
  EXPECT_EQ(sd15.kind, Kind::SD1);
  EXPECT_EQ(sd15.in_channels, 9);
  EXPECT_EQ(sd15.text_encoder, nullptr);
  expect_unet_equals_folder(*sd15.unet, "sd15-inpaint-tiny");

  auto tensors = tensors_of(single_file("sdxl_tiny"));
  for (auto& [name, t] : tensors)
    if (name == "model.diffusion_model.input_blocks.0.0.weight") t = zeros_of({16, 9, 3, 3});
  const StableDiffusionSingleFile sdxl =
      models::open_stable_diffusion_single_file(write("xl_inpaint", tensors));
  EXPECT_EQ(sdxl.kind, Kind::SDXL);
  EXPECT_EQ(sdxl.in_channels, 9);
  EXPECT_EQ(sdxl.unet->shape("conv_in.weight"), (Shape{16, 9, 3, 3}));

  for (auto& [name, t] : tensors)
    if (name == "model.diffusion_model.input_blocks.0.0.weight") t = zeros_of({16, 8, 3, 3});
  EXPECT_KILN_ERROR(models::open_stable_diffusion_single_file(write("eight", tensors)), "eight.safetensors",
                    "an SDXL UNet taking 8 input channels", "inpainting 9");
}

TEST(StableDiffusionSingleFile, OtherFamiliesAreNeitherSd1NorSdxl) {
  // FLUX.1's layout (Chroma's file) and Z-Image's: the message lists what the file holds instead.
  EXPECT_KILN_ERROR(models::open_stable_diffusion_single_file(
                        testing::data_path("goldens/chroma/transformer_single_file.safetensors")),
                    "transformer_single_file.safetensors", "neither SD1.x, SD2.x nor SDXL", "double_blocks (",
                    "single_blocks (");
  EXPECT_KILN_ERROR(models::open_stable_diffusion_single_file(
                        testing::data_path("goldens/z_image/transformer_single_file.safetensors")),
                    "neither SD1.x, SD2.x nor SDXL", "noise_refiner (", "x_embedder (");
  // ComfyUI's prefix is shown with the level under it, which tells the families apart.
  std::vector<std::pair<std::string, Tensor>> comfy;
  for (auto& [name, t] : tensors_of(testing::data_path("goldens/chroma/transformer_single_file.safetensors")))
    comfy.emplace_back("model.diffusion_model." + name, t);
  EXPECT_KILN_ERROR(models::open_stable_diffusion_single_file(write("comfy_flux", comfy)),
                    "neither SD1.x, SD2.x nor SDXL", "model.diffusion_model.double_blocks (");
}

TEST(StableDiffusionSingleFile, UnexpectedTensorsAreNamed) {
  const std::string path =
      write("extra", tensors_of(single_file("sd15_tiny"), "",
                                {{"model.diffusion_model.input_blocks.1.2.mystery.weight", zeros_of({4})},
                                 {"embedding_manager.embedder.weight", zeros_of({4})}}));
  EXPECT_KILN_ERROR(models::open_stable_diffusion_single_file(path), "extra.safetensors", "2 tensors",
                    "model.diffusion_model.input_blocks.1.2.mystery.weight",
                    "embedding_manager.embedder.weight");
}

// OpenCLIP's text tower renamed as stable-diffusion.cpp's loader names it (src/name_conversion.cpp:
// convert_open_clip_to_hf_clip_name): transformers' names under `to`, q/k/v still fused as self_attn.in_proj,
// text_projection kept as OpenCLIP's [width, projection]; its logit_scale kept aside.
std::string sdcpp_open_clip_name(const std::string& rest, const std::string& to) {
  static const std::pair<const char*, const char*> kTop[] = {
      {"ln_final.", "text_model.final_layer_norm."},
      {"positional_embedding", "text_model.embeddings.position_embedding.weight"},
      {"token_embedding.weight", "text_model.embeddings.token_embedding.weight"},
      {"text_projection", "text_model.text_projection"},
      {"logit_scale", "logit_scale"},
  };
  for (const auto& [from, into] : kTop)
    if (rest.rfind(from, 0) == 0) return to + into + rest.substr(std::string(from).size());
  static const std::pair<const char*, const char*> kBlock[] = {
      {"attn.in_proj_weight", "self_attn.in_proj.weight"},
      {"attn.in_proj_bias", "self_attn.in_proj.bias"},
      {"attn.out_proj.", "self_attn.out_proj."},
      {"ln_1.", "layer_norm1."},
      {"ln_2.", "layer_norm2."},
      {"mlp.c_fc.", "mlp.fc1."},
      {"mlp.c_proj.", "mlp.fc2."},
  };
  const std::string head = "transformer.resblocks.";
  EXPECT_EQ(rest.rfind(head, 0), 0u) << rest;
  const size_t dot = rest.find('.', head.size());
  const std::string layer = rest.substr(head.size(), dot - head.size()), tail = rest.substr(dot + 1);
  for (const auto& [from, into] : kBlock)
    if (tail.rfind(from, 0) == 0)
      return to + "text_model.encoder.layers." + layer + "." + into + tail.substr(std::string(from).size());
  ADD_FAILURE() << "no stable-diffusion.cpp name for " << rest;
  return rest;
}

// A file's tensors under stable-diffusion.cpp's names (what `sd -M convert` writes): SDXL's CLIP-L at
// cond_stage_model.transformer., bigG at cond_stage_model.1.transformer. (the refiner's lone bigG at
// cond_stage_model.transformer.), the UNet and the VAE as they were.
std::vector<std::pair<std::string, Tensor>> sdcpp_layout(const std::string& path) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, t] : tensors_of(path)) {
    std::string n = name;
    if (n.rfind("conditioner.embedders.0.transformer.", 0) == 0)
      n = "cond_stage_model.transformer." + n.substr(36);
    else if (n.rfind("conditioner.embedders.1.model.", 0) == 0)
      n = sdcpp_open_clip_name(n.substr(30), "cond_stage_model.1.transformer.");
    else if (n.rfind("conditioner.embedders.0.model.", 0) == 0)
      n = sdcpp_open_clip_name(n.substr(30), "cond_stage_model.transformer.");
    if (n.size() > 11 && n.compare(n.size() - 11, 11, "logit_scale") == 0) continue;  // sd.cpp drops it
    out.emplace_back(n, t);
  }
  return out;
}

TEST(StableDiffusionSingleFile, StableDiffusionCppNamesAreRead) {
  const StableDiffusionSingleFile xl =
      models::open_stable_diffusion_single_file(write("sdcpp_xl", sdcpp_layout(single_file("sdxl_tiny"))));
  EXPECT_EQ(xl.kind, Kind::SDXL);
  ASSERT_TRUE(xl.unet && xl.text_encoder && xl.text_encoder_2 && xl.vae);
  EXPECT_EQ(xl.text_encoder_2->shape("text_projection.weight"), (Shape{24, 32}));
  expect_unet_equals_folder(*xl.unet, "sdxl-tiny");
  expect_clip_equals_folder(*xl.text_encoder, "sdxl-tiny", "text_encoder");
  expect_clip_equals_folder(*xl.text_encoder_2, "sdxl-tiny", "text_encoder_2");
  expect_vae_equals_folder(*xl.vae, "sdxl-tiny");

  const StableDiffusionSingleFile refiner = models::open_stable_diffusion_single_file(
      write("sdcpp_refiner", sdcpp_layout(single_file("sdxl_refiner_tiny"))));
  EXPECT_EQ(refiner.kind, Kind::SDXLRefiner);
  EXPECT_EQ(refiner.text_encoder, nullptr);
  ASSERT_TRUE(refiner.text_encoder_2);
  expect_clip_equals_folder(*refiner.text_encoder_2, "sdxl-refiner-tiny", "text_encoder_2");
}

// A UNet alone under the original names without model.diffusion_model. (city96's ComfyUI-GGUF files,
// ComfyUI's extracted UNets) is read as with it.
TEST(StableDiffusionSingleFile, AUnetWithoutThePrefixIsRead) {
  std::vector<std::pair<std::string, Tensor>> bare;
  for (auto& [name, t] : tensors_of(single_file("sdxl_tiny"), "model.diffusion_model."))
    bare.emplace_back(name.substr(22), t);
  const StableDiffusionSingleFile sf = models::open_stable_diffusion_single_file(write("bare_unet", bare));
  EXPECT_EQ(sf.kind, Kind::SDXL);
  EXPECT_EQ(sf.text_encoder, nullptr);
  expect_unet_equals_folder(*sf.unet, "sdxl-tiny");
  // What is no UNet tensor is still named.
  bare.emplace_back("cond_stage_model.transformer.text_model.final_layer_norm.weight", zeros_of({32}));
  EXPECT_KILN_ERROR(models::open_stable_diffusion_single_file(write("bare_extra", bare)), "1 tensors",
                    "model.diffusion_model.cond_stage_model.transformer.text_model.final_layer_norm.weight");
}

TEST(StableDiffusionSingleFile, SdxlWithoutClipLIsRefused) {
  auto tensors = tensors_of(single_file("sdxl_tiny"));
  std::erase_if(tensors, [](const auto& t) { return t.first.rfind("conditioner.embedders.0.", 0) == 0; });
  EXPECT_KILN_ERROR(models::open_stable_diffusion_single_file(write("no_clip_l", tensors)),
                    "OpenCLIP bigG but no CLIP-L", "SDXL needs both text encoders");
}

}  // namespace
}  // namespace kiln
