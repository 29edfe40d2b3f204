// Whole pipelines on a PJRT device (pipe.to("xla-cpu")): the tiny FLUX.1, SD3.5 and FLUX.2 pipelines give
// diffusers' image within one 8-bit level, the bar the CPU backend passes (tests/pipelines/*_test.cpp), and
// the CPU backend's image, in strict eager and in the fused and compiled modes; bf16 stays within bf16
// rounding of the CPU's bf16 image. The noise is torch's CPU generator's on every device, so these are the
// same images. Also: one component moved (pipe.vae.to), back to the cpu, and what a device refuses (weights
// kept block-quantized, sequential offload) with errors that name it. Offloading onto the device:
// offload_on_device_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "kiln/core/error.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/io/safetensors.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "lora/lora_goldens.h"
#include "support/pipeline_comparison.h"
#include "support/pjrt_devices.h"
#include "support/scoped_env.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const Device xla0 = testing::test_device(0);

std::unique_ptr<DiffusionPipeline> load(const std::string& model, DType dtype = float32) {
  PipelineLoadOptions options;
  options.dtype = dtype;
  return DiffusionPipeline::from_pretrained(testing::data_path("models/" + model), options);
}

int max_level_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  int most = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) most = std::max(most, std::abs(a[i] - b[i]));
  return most;
}

int max_level_difference(const std::vector<uint8_t>& a, const Tensor& reference_u8) {
  return max_level_difference(a, reference_u8.contiguous().to_vector<uint8_t>());
}

// One call, timed (the wall times go to the test's output: the report compares the devices).
PipelineOutput timed_call(DiffusionPipeline& pipe, const PipelineRequest& request, const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  PipelineOutput out = pipe(request);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ timing   ] %s on %s: %.2f s\n", what.c_str(), pipe.device().str().c_str(), seconds);
  return out;
}

// The golden run `golden` of the pipeline in `model` on the cpu and on xla-cpu: the device's image is
// diffusers' within one level (on 99% of values, as on the cpu) and the cpu's within one level everywhere.
void expect_device_matches(const std::string& model, const io::SafetensorsFile& golden,
                           const PipelineRequest& request, const std::string& name) {
  auto pipe = load(model);
  const PipelineOutput on_cpu = timed_call(*pipe, request, name);
  // Timed again warm (the cpu's packed weights and generated kernels made), for the comparison with the
  // device.
  EXPECT_EQ(timed_call(*pipe, request, name + " (second call)").images[0].pixels, on_cpu.images[0].pixels);
  pipe->to(xla0);
  EXPECT_EQ(pipe->device(), xla0);
  const PipelineOutput on_device = timed_call(*pipe, request, name);
  // Compiled once per op and shape: a second call reuses every executable.
  const PipelineOutput again = timed_call(*pipe, request, name + " (second call)");
  ASSERT_EQ(on_device.images.size(), on_cpu.images.size());
  for (size_t b = 0; b < on_device.images.size(); ++b) {
    const Tensor reference = on_device.images.size() > 1
                                 ? golden.tensor("image_u8").select(0, static_cast<int64_t>(b))
                                 : golden.tensor("image_u8");
    const std::vector<uint8_t>& pixels = on_device.images[b].pixels;
    std::printf("[ levels   ] %s image %zu: max %d vs diffusers, max %d vs the cpu backend\n", name.c_str(),
                b, max_level_difference(pixels, reference),
                max_level_difference(pixels, on_cpu.images[b].pixels));
    EXPECT_GE(testing::share_within_one_level(pixels, reference), 0.99) << name << " image " << b;
    EXPECT_LE(max_level_difference(pixels, on_cpu.images[b].pixels), 1) << name << " image " << b;
    EXPECT_EQ(again.images[b].pixels, pixels) << name << ": a second call on the device changed the image";
  }
}

TEST(PipelinesOnDevice, FluxSchnellGivesDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux/schnell_cat_64x64_s0.safetensors"));
  expect_device_matches(g.metadata().at("pipeline"), g, testing::request_from_golden(g),
                        "FluxPipeline schnell f32");
}

TEST(PipelinesOnDevice, FluxDevWithGuidanceGivesDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux/dev_unicode_80x48_s1234.safetensors"));
  expect_device_matches(g.metadata().at("pipeline"), g, testing::request_from_golden(g),
                        "FluxPipeline dev f32");
}

TEST(PipelinesOnDevice, Sd3WithClassifierFreeGuidanceGivesDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/sd3/medium_cat_64x64_s0.safetensors"));
  const auto& m = g.metadata();
  ASSERT_EQ(m.at("cfg"), "true");
  PipelineRequest c = testing::request_from_golden(g);
  if (m.count("negative_prompt")) c.negative_prompt = m.at("negative_prompt");
  expect_device_matches(m.at("pipeline"), g, c, "StableDiffusion3Pipeline medium f32");
}

// A TPU's attention (over blocks of keys with a running softmax, lower_fused.cpp) on the CPU plugin, blocks
// small enough that the transformer's joint attention (16 image + 256 text tokens) and the VAE's
// mid-block attention run as loops with a partial last block: still diffusers' image. SD3.5's CFG batch too.
TEST(PipelinesOnDevice, AttentionOverKeyBlocksGivesDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  testing::ScopedEnv env;
  env.set("KILN_PJRT_ATTENTION_KEY_BLOCK", "24");
  const io::SafetensorsFile flux(testing::data_path("goldens/flux/schnell_cat_64x64_s0.safetensors"));
  expect_device_matches(flux.metadata().at("pipeline"), flux, testing::request_from_golden(flux),
                        "FluxPipeline schnell f32, attention over blocks of 24 keys");
  const io::SafetensorsFile sd3(testing::data_path("goldens/sd3/medium_cat_64x64_s0.safetensors"));
  PipelineRequest c = testing::request_from_golden(sd3);
  if (sd3.metadata().count("negative_prompt")) c.negative_prompt = sd3.metadata().at("negative_prompt");
  expect_device_matches(sd3.metadata().at("pipeline"), sd3, c,
                        "StableDiffusion3Pipeline medium f32, attention over blocks of 24 keys");
}

// FLUX.2 from the prompt: its decoder text encoder (Qwen3), guidance by a second transformer call, a batch
// of two.
TEST(PipelinesOnDevice, Flux2KleinGivesDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(
      testing::data_path("goldens/flux2_e2e/klein_cfg_empty_48x48_s6_n2.safetensors"));
  const auto& m = g.metadata();
  PipelineRequest c = testing::request_from_golden(g);
  c.negative_prompt = m.at("negative_prompt");
  c.num_images_per_prompt = std::stoi(m.at("num_images_per_prompt"));
  ASSERT_EQ(c.num_images_per_prompt, 2);
  expect_device_matches(m.at("pipeline"), g, c, "Flux2KleinPipeline f32");
}

// A reference image: the VAE encodes it on the device and its tokens join the latents'.
TEST(PipelinesOnDevice, Flux2WithAReferenceImageGivesDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux2_e2e/dev_ref1_64x48_s3.safetensors"));
  const auto& m = g.metadata();
  PipelineRequest c = testing::request_from_golden(g);
  c.negative_prompt = m.at("negative_prompt");
  c.image.push_back(Image::load(testing::data_path("goldens/flux2/" + m.at("references") + ".png")));
  expect_device_matches(m.at("pipeline"), g, c, "Flux2Pipeline dev reference f32");
}

// The deferred-and-fused and compiled modes on the device (one StableHLO module per region, per forward or
// per block class): diffusers' image, as in strict eager, and strict eager's image within one level.
class PipelinesOnDeviceModes : public ::testing::TestWithParam<ExecutionMode> {};

void expect_mode_matches(const std::string& model, const io::SafetensorsFile& golden,
                         const PipelineRequest& request, const std::string& pipeline) {
  auto pipe = load(model);
  pipe->to(xla0);
  const PipelineOutput eager = (*pipe)(request);
  pipe->configure({.mode = ::testing::TestWithParam<ExecutionMode>::GetParam()});
  const std::string name =
      pipeline + " --mode " + execution_mode_name(::testing::TestWithParam<ExecutionMode>::GetParam());
  const PipelineOutput out = timed_call(*pipe, request, name);
  const PipelineOutput again = timed_call(*pipe, request, name + " (second call)");
  ASSERT_EQ(out.images.size(), eager.images.size());
  for (size_t b = 0; b < out.images.size(); ++b) {
    const Tensor reference = out.images.size() > 1
                                 ? golden.tensor("image_u8").select(0, static_cast<int64_t>(b))
                                 : golden.tensor("image_u8");
    const std::vector<uint8_t>& pixels = out.images[b].pixels;
    std::printf("[ levels   ] %s image %zu: max %d vs diffusers, max %d vs strict eager\n", name.c_str(), b,
                max_level_difference(pixels, reference),
                max_level_difference(pixels, eager.images[b].pixels));
    EXPECT_GE(testing::share_within_one_level(pixels, reference), 0.99) << name << " image " << b;
    EXPECT_LE(max_level_difference(pixels, eager.images[b].pixels), 1) << name << " image " << b;
    EXPECT_EQ(again.images[b].pixels, pixels) << name << ": the second call changed the image";
  }
}

TEST_P(PipelinesOnDeviceModes, FluxGivesDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux/schnell_cat_64x64_s0.safetensors"));
  expect_mode_matches(g.metadata().at("pipeline"), g, testing::request_from_golden(g),
                      "FluxPipeline schnell f32");
}

TEST_P(PipelinesOnDeviceModes, Sd3GivesDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/sd3/medium_cat_64x64_s0.safetensors"));
  PipelineRequest c = testing::request_from_golden(g);
  if (g.metadata().count("negative_prompt")) c.negative_prompt = g.metadata().at("negative_prompt");
  expect_mode_matches(g.metadata().at("pipeline"), g, c, "StableDiffusion3Pipeline medium f32");
}

TEST_P(PipelinesOnDeviceModes, Flux2KleinGivesDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(
      testing::data_path("goldens/flux2_e2e/klein_cfg_empty_48x48_s6_n2.safetensors"));
  PipelineRequest c = testing::request_from_golden(g);
  c.negative_prompt = g.metadata().at("negative_prompt");
  c.num_images_per_prompt = std::stoi(g.metadata().at("num_images_per_prompt"));
  expect_mode_matches(g.metadata().at("pipeline"), g, c, "Flux2KleinPipeline f32");
}

INSTANTIATE_TEST_SUITE_P(EveryMode, PipelinesOnDeviceModes,
                         ::testing::Values(ExecutionMode::Fuse, ExecutionMode::Compile,
                                           ExecutionMode::CompileBlocks),
                         [](const auto& info) {
                           std::string name = execution_mode_name(info.param);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// bf16 rounds at every op, in an order XLA may change (it fuses and reassociates elementwise chains), so the
// device's image is the cpu backend's within a few levels rather than bit for bit.
TEST(PipelinesOnDevice, Bfloat16StaysCloseToTheCpuBackend) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux/devbf16_cat_64x64_s0.safetensors"));
  auto pipe = load(g.metadata().at("pipeline"), bfloat16);
  const PipelineOutput on_cpu = timed_call(*pipe, testing::request_from_golden(g), "FluxPipeline dev bf16");
  pipe->to(xla0);
  const PipelineOutput on_device =
      timed_call(*pipe, testing::request_from_golden(g), "FluxPipeline dev bf16");
  const Tensor cpu_u8 =
      Tensor::from_vector(on_cpu.images[0].pixels, {static_cast<int64_t>(on_cpu.images[0].pixels.size())});
  const double mean = testing::mean_level_difference(on_device.images[0].pixels, cpu_u8);
  const int most = max_level_difference(on_device.images[0].pixels, on_cpu.images[0].pixels);
  std::printf(
      "[ levels   ] FluxPipeline dev bf16: mean %.3f, max %d vs the cpu backend; max %d vs diffusers\n", mean,
      most, max_level_difference(on_device.images[0].pixels, g.tensor("image_u8")));
  EXPECT_LE(mean, 1.0);
  EXPECT_LE(most, 8);
  EXPECT_LE(testing::mean_level_difference(on_device.images[0].pixels, g.tensor("image_u8")), 2.0)
      << "the bar the cpu backend's bf16 image passes against diffusers";
}

// diffusers' pipe.vae.to(device): the other components stay on the cpu, each stage moves its inputs.
TEST(PipelinesOnDevice, OneComponentMovesAlone) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux/schnell_cat_64x64_s0.safetensors"));
  auto pipe = load(g.metadata().at("pipeline"));
  const PipelineOutput on_cpu = (*pipe)(testing::request_from_golden(g));
  const int64_t before = memory_stats(xla0).current_bytes;
  pipe->component_to("vae", xla0);
  EXPECT_EQ(pipe->device(), cpu) << "the transformer stays";
  // component_to and to return once the weights are on the device (the copies are not left in flight).
  const int64_t with_vae = memory_stats(xla0).current_bytes;
  EXPECT_GT(with_vae, before);
  const PipelineOutput split = (*pipe)(testing::request_from_golden(g));
  EXPECT_LE(max_level_difference(split.images[0].pixels, on_cpu.images[0].pixels), 1);
  // The whole pipeline there and back: the cpu backend's image again, exactly.
  pipe->to(xla0);
  EXPECT_GT(memory_stats(xla0).current_bytes, with_vae);
  pipe->to(cpu);
  EXPECT_EQ(pipe->device(), cpu);
  EXPECT_EQ((*pipe)(testing::request_from_golden(g)).images[0].pixels, on_cpu.images[0].pixels);
}

// LoRA adapters beside the weights on the device: loaded before the move (the pairs follow the weights) or
// after it (the pairs are built where the weights are), and fused on the device.
TEST(PipelinesOnDevice, LoraAdaptersGiveDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  for (const char* name : {"flux_two_adapters", "flux_two_adapters_fused", "flux_two_adapters_unfused"}) {
    const testing::LoraGolden g(name);
    auto before = g.load();
    g.replay(*before);
    before->to(xla0);
    auto after = g.load();
    after->to(xla0);
    g.replay(*after);
    for (DiffusionPipeline* pipe : {before.get(), after.get()}) {
      const std::vector<uint8_t> pixels = (*pipe)(g.request()).images[0].pixels;
      std::printf("[ levels   ] LoRA %s: max %d vs diffusers\n", name,
                  max_level_difference(pixels, g.image()));
      EXPECT_GE(testing::share_within_one_level(pixels, g.image()), 0.99) << name;
    }
  }
}

TEST(PipelinesOnDevice, WhatADeviceCannotHoldIsRefusedByName) {
  KILN_SKIP_WITHOUT_PJRT();
  // GGUF blocks have kernels on the cpu only: the parameter is named, and nothing moves.
  PipelineLoadOptions gguf;
  gguf.transformer_file = testing::data_path("gguf/flux-tiny-dev-Q8_0.gguf");
  auto quantized = DiffusionPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"), gguf);
  const std::string refused = testing::error_message([&] { quantized->to(xla0); });
  EXPECT_NE(refused.find("is kept block-quantized (Q8_0)"), std::string::npos) << refused;
  EXPECT_NE(refused.find("parameter '"), std::string::npos) << refused;
  for (const auto& [name, module] : quantized->components())
    if (module != nullptr) {
      EXPECT_EQ(module->device(), cpu) << name << " moved although the call was refused";
    }

  auto pipe = load("flux-tiny-schnell");
  EXPECT_NE(
      testing::error_message([&] {
        pipe->component_to("unet", xla0);
      }).find("FluxPipeline has no component 'unet' (it has text_encoder, text_encoder_2, transformer, vae)"),
      std::string::npos);
  pipe->to(xla0);
  // Sequential offload streams weights to the cpu's kernels: refused, naming the component on the device.
  const std::string sequential = testing::error_message([&] { pipe->enable_sequential_cpu_offload(); });
  EXPECT_NE(sequential.find("enable_sequential_cpu_offload: text_encoder is on " + xla0.str()),
            std::string::npos)
      << sequential;
  const std::string configured =
      testing::error_message([&] { pipe->configure({.offload = OffloadMode::Sequential, .device = xla0}); });
  EXPECT_NE(
      configured.find("sequential offload runs on the cpu only; onto " + xla0.str() + " use model or group"),
      std::string::npos)
      << configured;
}

}  // namespace
}  // namespace kiln
