// Offloading onto a PJRT device (the test device: xla-cpu unless KILN_TEST_DEVICE says otherwise): the
// weights stay on the host and are copied into the device's memory as they run — a component at a time
// (enable_model_cpu_offload(device)) or in groups of blocks with the next group copied ahead
// (enable_group_offload with onload_device) — and the image is the one the pipeline gives with every
// component resident on the device (pipe.to), which is diffusers' image. Kiln's count of the device's memory
// peaks lower under offload. A memory budget on the device picks the offload and limits what Kiln holds
// there; one below the largest weight or below one-block groups is refused naming the sizes, and running out
// of device memory (Kiln's limit, or the plugin's own allocator) is a kiln::Error naming the device, the
// bytes and what to do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/allocator.h"
#include "kiln/core/error.h"
#include "kiln/io/safetensors.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/runtime/memory_policy.h"
#include "support/pipeline_comparison.h"
#include "support/pjrt_devices.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const Device xla0 = testing::test_device(0);

std::unique_ptr<DiffusionPipeline> load(const std::string& model) {
  return DiffusionPipeline::from_pretrained(testing::data_path("models/" + model), {});
}

// One call's image and the most device memory Kiln held above what it held before the call.
struct DeviceRun {
  std::vector<uint8_t> pixels;
  int64_t peak = 0;
};

DeviceRun run(DiffusionPipeline& pipe, const PipelineRequest& request) {
  const int64_t before = memory_stats(xla0).current_bytes;
  reset_peak_memory(xla0);
  DeviceRun r;
  r.pixels = pipe(request).images.at(0).pixels;
  r.peak = memory_stats(xla0).peak_bytes - before;
  return r;
}

// The pipeline with every component resident on the device: the reference image and peak.
DeviceRun resident_run(const std::string& model, const PipelineRequest& request) {
  const int64_t before = memory_stats(xla0).current_bytes;
  auto pipe = load(model);
  pipe->to(xla0);
  DeviceRun r = run(*pipe, request);
  r.peak = memory_stats(xla0).peak_bytes - before;  // the weights count: they are held on the device
  return r;
}

void expect_same_image(const DeviceRun& offloaded, const DeviceRun& resident, const io::SafetensorsFile& g,
                       const std::string& what) {
  EXPECT_EQ(offloaded.pixels, resident.pixels) << what << ": the image differs from the resident run's";
  EXPECT_GE(testing::share_within_one_level(offloaded.pixels, g.tensor("image_u8")), 0.99)
      << what << ": not diffusers' image";
  std::printf("[ memory   ] %s: device peak %lld bytes, %lld with every component resident\n", what.c_str(),
              static_cast<long long>(offloaded.peak), static_cast<long long>(resident.peak));
  EXPECT_LT(offloaded.peak, resident.peak) << what << ": offloading did not lower the device's peak";
}

TEST(OffloadOnDevice, ModelOffloadGivesTheResidentImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux/schnell_cat_64x64_s0.safetensors"));
  const PipelineRequest request = testing::request_from_golden(g);
  const DeviceRun resident = resident_run(g.metadata().at("pipeline"), request);
  auto pipe = load(g.metadata().at("pipeline"));
  pipe->enable_model_cpu_offload(xla0);
  EXPECT_EQ(pipe->device(), xla0);
  const int64_t idle = memory_stats(xla0).current_bytes;
  const DeviceRun offloaded = run(*pipe, request);
  expect_same_image(offloaded, resident, g, "FLUX.1 model offload onto " + xla0.str());
  // Every component sent out once it ran: the device holds what it held before the call.
  EXPECT_EQ(memory_stats(xla0).current_bytes, idle);
  EXPECT_EQ(run(*pipe, request).pixels, resident.pixels) << "a second call changed the image";
}

TEST(OffloadOnDevice, GroupOffloadGivesTheResidentImage) {
  KILN_SKIP_WITHOUT_PJRT();
  for (const char* golden :
       {"goldens/flux/schnell_cat_64x64_s0.safetensors", "goldens/sd3/medium_cat_64x64_s0.safetensors"}) {
    const io::SafetensorsFile g(testing::data_path(golden));
    const PipelineRequest request = testing::request_from_golden(g);
    const DeviceRun resident = resident_run(g.metadata().at("pipeline"), request);
    auto pipe = load(g.metadata().at("pipeline"));
    pipe->enable_group_offload({.blocks_per_group = 1, .prefetch = true, .onload_device = xla0});
    const DeviceRun offloaded = run(*pipe, request);
    expect_same_image(offloaded, resident, g,
                      std::string(pipe->class_name()) + " group offload onto " + xla0.str());
    const WeightGroupStats stats = pipe->context().memory().weight_group_stats();
    EXPECT_GT(stats.switches, 0) << "no group ran";
    EXPECT_GT(stats.prefetches, 0) << "no group was brought in ahead";
    EXPECT_GT(stats.prefetched_bytes, 0) << "the prefetches copied nothing to the device";
  }
}

// In the compiled modes on a device the transformer runs as programs whose weights are their inputs: a
// program reading every block's weights would hold them all at once. Under group offload each program reads
// one group's weights at most (the whole-forward program is split where the group changes), so the denoising
// steps never hold all of the transformer's weights, in every mode, and the image stays the resident one.
TEST(OffloadOnDevice, GroupOffloadStreamsTheGroupsInEveryMode) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux/schnell_cat_64x64_s0.safetensors"));
  for (ExecutionMode mode :
       {ExecutionMode::Eager, ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks}) {
    const std::string what = std::string("group offload, ") + execution_mode_name(mode);
    auto resident = load(g.metadata().at("pipeline"));
    resident->configure({.mode = mode, .offload = OffloadMode::None, .device = xla0});
    const std::vector<uint8_t> resident_image = run(*resident, testing::request_from_golden(g)).pixels;
    resident.reset();

    auto pipe = load(g.metadata().at("pipeline"));
    int64_t transformer_bytes = 0;
    for (const ComponentResidency& r : plan_offload(pipe->components(), int64_t{1} << 40).components)
      if (r.name == "transformer") transformer_bytes = r.bytes;
    ASSERT_GT(transformer_bytes, 0);
    pipe->configure({.mode = mode, .offload = OffloadMode::Group, .device = xla0});
    // The most Kiln holds on the device from the end of the first step (programs compiled) to the last.
    PipelineRequest request = testing::request_from_golden(g);
    int64_t steps_peak = 0;
    request.callback_on_step_end = [&](StepState& s) {
      synchronize(xla0);
      if (s.step == 0) reset_peak_memory(xla0);
      steps_peak = memory_stats(xla0).peak_bytes;
    };
    const DeviceRun offloaded = run(*pipe, request);
    ASSERT_EQ(offloaded.pixels.size(), resident_image.size());
    int most = 0;  // XLA may fuse a region split for the groups differently: within one 8-bit level
    for (size_t i = 0; i < resident_image.size(); ++i)
      most = std::max(most, std::abs(offloaded.pixels[i] - resident_image[i]));
    std::printf(
        "[ memory   ] %s: %lld bytes at most on the device while denoising, the transformer's weights %lld; "
        "%d levels from the resident image at most\n",
        what.c_str(), static_cast<long long>(steps_peak), static_cast<long long>(transformer_bytes), most);
    EXPECT_LT(steps_peak, transformer_bytes) << what << ": the transformer's weights were all held at once";
    EXPECT_LE(most, 1) << what << ": not the resident image";
    EXPECT_GE(testing::share_within_one_level(offloaded.pixels, g.tensor("image_u8")), 0.99)
        << what << ": not diffusers' image";
  }
}

// The pipeline moved to the device first (pipe.to), then offloaded: the weights come back to the host and
// the offload goes onto the device the pipeline was on.
TEST(OffloadOnDevice, AResidentPipelineOffloadsOntoItsDevice) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux/schnell_cat_64x64_s0.safetensors"));
  const PipelineRequest request = testing::request_from_golden(g);
  auto pipe = load(g.metadata().at("pipeline"));
  pipe->to(xla0);
  const DeviceRun resident = run(*pipe, request);
  pipe->enable_model_cpu_offload();
  EXPECT_EQ(pipe->device(), xla0);
  EXPECT_EQ(run(*pipe, request).pixels, resident.pixels);
  pipe->to(cpu);
  EXPECT_EQ(pipe->device(), cpu);
}

TEST(OffloadOnDevice, AMemoryBudgetPicksTheOffloadAndIsRefusedBelowWhatItNeeds) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux/schnell_cat_64x64_s0.safetensors"));
  const PipelineRequest request = testing::request_from_golden(g);
  const DeviceRun resident = resident_run(g.metadata().at("pipeline"), request);
  auto pipe = load(g.metadata().at("pipeline"));
  const OffloadPlan sizes = plan_offload(pipe->components(), int64_t{1} << 40);
  int64_t group_minimum = 0;
  for (const ComponentResidency& r : sizes.components)
    group_minimum = std::max(group_minimum, r.group_minimum);

  // Room for every weight and the activations: nothing offloaded, the limit never reached.
  const OffloadPlan roomy = pipe->set_memory_budget(resident.peak, xla0);
  EXPECT_EQ(roomy.mode, OffloadMode::None) << roomy.describe();
  EXPECT_EQ(memory_limit(xla0), resident.peak);
  EXPECT_EQ(run(*pipe, request).pixels, resident.pixels);

  // Below the largest weight, and below one-block groups: refused before anything moves, naming the sizes.
  const std::string below_weight =
      testing::error_message([&] { pipe->set_memory_budget(sizes.largest_tensor_bytes - 1, xla0); });
  EXPECT_NE(below_weight.find("is below the largest weight, " + sizes.largest_tensor), std::string::npos)
      << below_weight;
  if (group_minimum > sizes.largest_tensor_bytes) {
    const std::string below_groups =
        testing::error_message([&] { pipe->set_memory_budget(group_minimum - 1, xla0); });
    EXPECT_NE(below_groups.find("on " + xla0.str() + " is below what group offload needs there"),
              std::string::npos)
        << below_groups;
    EXPECT_NE(below_groups.find("sequential offload, one weight at a time, runs on the cpu only"),
              std::string::npos)
        << below_groups;
  }

  // Below the whole pipeline's weights: model or group offload, the same image within the limit.
  const int64_t tight_budget = sizes.weight_bytes - 1;
  const OffloadPlan tight = pipe->set_memory_budget(tight_budget, xla0);
  EXPECT_NE(tight.mode, OffloadMode::None) << tight.describe();
  const DeviceRun limited = run(*pipe, request);
  EXPECT_EQ(limited.pixels, resident.pixels) << tight.describe();
  EXPECT_LE(memory_stats(xla0).peak_bytes, tight_budget);

  // pipe.to lifts the limit.
  pipe->to(xla0);
  EXPECT_EQ(memory_limit(xla0), std::nullopt);
}

// Kiln's limit on the device's memory, reached by a call: a kiln::Error naming the device, the bytes asked
// and held, and what to do; the pipeline works again once the limit is lifted.
TEST(OffloadOnDevice, RunningOutOfDeviceMemoryIsAnErrorNamingTheDevice) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux/schnell_cat_64x64_s0.safetensors"));
  const PipelineRequest request = testing::request_from_golden(g);
  auto pipe = load(g.metadata().at("pipeline"));
  pipe->enable_model_cpu_offload(xla0);
  set_memory_limit(xla0, memory_stats(xla0).current_bytes + 4096);
  const std::string message = testing::error_message([&] { (*pipe)(request); });
  set_memory_limit(xla0, std::nullopt);
  EXPECT_NE(message.find(xla0.str() + " is out of memory: "), std::string::npos) << message;
  EXPECT_NE(message.find(" needs "), std::string::npos) << message;
  EXPECT_NE(message.find("limit (--max-memory, kiln::set_memory_limit) already held"), std::string::npos)
      << message;
  EXPECT_NE(message.find("--offload model or group"), std::string::npos) << message;
  EXPECT_EQ((*pipe)(request).images.size(), 1u);

  EXPECT_NE(testing::error_message([&] { set_memory_limit(cpu, 1 << 20); }).find("cpu: a memory limit"),
            std::string::npos);
}

// The plugin's own allocator out of memory (an array far larger than this machine): its RESOURCE_EXHAUSTED
// is the same kiln::Error. In a child process: a plugin may abort instead of reporting it.
TEST(OffloadOnDeviceDeathTest, ThePluginOutOfMemoryIsAnErrorNamingTheDevice) {
  KILN_SKIP_WITHOUT_PJRT();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const std::string m = testing::error_message([&] {
          // One float broadcast to 4 TiB by the device's own copy: nothing that large on the host.
          const Tensor one = Tensor::zeros({1}, float32, xla0);
          const Tensor huge = one.expand({int64_t{1} << 40}).contiguous();
          synchronize(xla0);
        });
        std::fprintf(stderr, "%s\n", m.c_str());
        std::exit(0);
      },
      ::testing::ExitedWithCode(0),
      xla0.str() + " is out of memory: .* needs 4.00 TiB.*the plugin said: .*RESOURCE_EXHAUSTED");
}

}  // namespace
}  // namespace kiln
