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
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/allocator.h"
#include "kiln/core/error.h"
#include "kiln/io/safetensors.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/runtime/device_ledger.h"
#include "kiln/runtime/execution_context.h"
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

// The most any component holds under group offload with one-block groups.
int64_t group_offload_minimum(const OffloadPlan& sizes) {
  int64_t most = 0;
  for (const ComponentResidency& r : sizes.components) most = std::max(most, r.group_minimum);
  return most;
}

// The tiny FLUX.1 schnell golden's call, for the memory budget tests: its image with every component resident
// on the device, a fresh pipeline to budget, and its weights' sizes (the plan with no limit).
struct BudgetSetup {
  PipelineRequest request;
  DeviceRun resident;
  std::unique_ptr<DiffusionPipeline> pipe;
  OffloadPlan sizes;
};

// The memory limit of `pipe`'s execution context on the device (a budget limits its own context's arrays).
std::optional<int64_t> limit_of(const DiffusionPipeline& pipe) {
  ExecutionScope in(pipe.context());
  return memory_limit(xla0);
}

BudgetSetup flux_budget_setup() {
  const io::SafetensorsFile g(testing::data_path("goldens/flux/schnell_cat_64x64_s0.safetensors"));
  BudgetSetup s;
  s.request = testing::request_from_golden(g);
  s.resident = resident_run(g.metadata().at("pipeline"), s.request);
  s.pipe = load(g.metadata().at("pipeline"));
  s.sizes = plan_offload(s.pipe->components(), int64_t{1} << 40);
  return s;
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
  const BudgetSetup setup = flux_budget_setup();
  const PipelineRequest& request = setup.request;
  const DeviceRun& resident = setup.resident;
  const std::unique_ptr<DiffusionPipeline>& pipe = setup.pipe;
  const OffloadPlan& sizes = setup.sizes;
  const int64_t group_minimum = group_offload_minimum(sizes);
  // The budget keeps the call's activations free beside the weights: their estimate covers what they hold.
  const int64_t activations = pipe->estimate_activations(request, xla0).peak();
  EXPECT_GE(activations, resident.peak - sizes.weight_bytes) << "the activations' estimate is short";

  // Room for every weight and the activations: nothing offloaded, the limit never reached.
  const int64_t roomy_budget = sizes.weight_bytes + activations;
  pipe->set_memory_budget(roomy_budget, xla0);
  EXPECT_EQ(limit_of(*pipe), roomy_budget);
  EXPECT_EQ(memory_limit(xla0), std::nullopt) << "the budget limits the pipeline's context alone";
  EXPECT_EQ(run(*pipe, request).pixels, resident.pixels);
  const OffloadPlan roomy = pipe->device_memory_plan().value();
  EXPECT_EQ(roomy.mode, OffloadMode::None) << roomy.describe();

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

  // Below the whole pipeline's weights and the activations: model or group offload, the same image within the
  // limit.
  const int64_t tight_budget = sizes.weight_bytes - 1 + activations;
  pipe->set_memory_budget(tight_budget, xla0);
  const DeviceRun limited = run(*pipe, request);
  const OffloadPlan tight = pipe->device_memory_plan().value();
  EXPECT_NE(tight.mode, OffloadMode::None) << tight.describe();
  EXPECT_EQ(tight.activations, activations) << tight.describe();
  EXPECT_EQ(limited.pixels, resident.pixels) << tight.describe();
  EXPECT_LE(memory_stats(xla0).peak_bytes, tight_budget);

  // pipe.to lifts the limit.
  pipe->to(xla0);
  EXPECT_EQ(limit_of(*pipe), std::nullopt);
}

// The activations' estimate covers what a call holds on the device beside the weights (every component
// resident, strict eager), at two sizes: FLUX.1, SD3.5 with classifier-free guidance, FLUX.2 [klein] with
// guidance and two images, FLUX.2 [dev] with a reference image.
TEST(OffloadOnDevice, TheActivationEstimateCoversWhatACallHolds) {
  KILN_SKIP_WITHOUT_PJRT();
  struct Case {
    std::string golden;
    std::function<void(PipelineRequest&, const std::map<std::string, std::string>&)> extra;
  };
  const std::vector<Case> cases = {
      {"goldens/flux/schnell_cat_64x64_s0.safetensors", {}},
      {"goldens/sd3/medium_cat_64x64_s0.safetensors",
       [](PipelineRequest& c, const auto& m) { c.negative_prompt = m.at("negative_prompt"); }},
      {"goldens/flux2_e2e/klein_cfg_empty_48x48_s6_n2.safetensors",
       [](PipelineRequest& c, const auto& m) {
         c.negative_prompt = m.at("negative_prompt");
         c.num_images_per_prompt = std::stoi(m.at("num_images_per_prompt"));
       }},
      {"goldens/flux2_e2e/dev_ref1_64x48_s3.safetensors",
       [](PipelineRequest& c, const auto& m) {
         c.negative_prompt = m.at("negative_prompt");
         c.image.push_back(Image::load(testing::data_path("goldens/flux2/" + m.at("references") + ".png")));
       }},
  };
  for (const Case& k : cases) {
    const io::SafetensorsFile g(testing::data_path(k.golden));
    auto pipe = load(g.metadata().at("pipeline"));
    pipe->to(xla0);
    for (int64_t size : {64, 128}) {
      PipelineRequest request = testing::request_from_golden(g);
      if (k.extra) k.extra(request, g.metadata());
      request.height = request.width = size;
      (*pipe)(request);  // every weight brought in
      synchronize(xla0);
      const int64_t weights = memory_stats(xla0).current_bytes;
      reset_peak_memory(xla0);
      (*pipe)(request);
      synchronize(xla0);
      const int64_t held = memory_stats(xla0).peak_bytes - weights;
      const ActivationEstimate estimate = pipe->estimate_activations(request, xla0);
      std::printf("[ memory   ] %s %lldx%lld: activations held %lld bytes, estimated %s\n",
                  pipe->class_name(), static_cast<long long>(size), static_cast<long long>(size),
                  static_cast<long long>(held), estimate.describe().c_str());
      EXPECT_GE(estimate.peak(), held) << k.golden << " at " << size;
      EXPECT_EQ(estimate.height, size);
    }
  }
}

// A denoising step's share of the estimate against what a step holds in strict eager (one array per op
// output) and compiled (one program: its activations are XLA's scratch, counted while it runs): from the end
// of the first step (programs compiled) to the last, above what the device held at the end of the first.
TEST(OffloadOnDevice, TheTransformerEstimateCoversAStepInEagerAndCompiledModes) {
  KILN_SKIP_WITHOUT_PJRT();
  for (const std::string golden :
       {"goldens/flux/schnell_cat_64x64_s0.safetensors", "goldens/sd3/medium_cat_64x64_s0.safetensors"}) {
    const io::SafetensorsFile g(testing::data_path(golden));
    for (ExecutionMode mode : {ExecutionMode::Eager, ExecutionMode::Compile}) {
      auto pipe = load(g.metadata().at("pipeline"));
      pipe->configure({.mode = mode, .offload = OffloadMode::None, .device = xla0});
      PipelineRequest request = testing::request_from_golden(g);
      if (g.metadata().contains("negative_prompt"))
        request.negative_prompt = g.metadata().at("negative_prompt");
      request.height = request.width = 128;
      request.num_inference_steps = 3;
      int64_t held_before = 0, steps_peak = 0;
      request.callback_on_step_end = [&](StepState& s) {
        synchronize(xla0);
        if (s.step == 0) {
          held_before = memory_stats(xla0).current_bytes;
          reset_peak_memory(xla0);
        }
        steps_peak = memory_stats(xla0).peak_bytes;
      };
      (*pipe)(request);
      const int64_t held = steps_peak - held_before;
      const int64_t estimate = pipe->estimate_activations(request, xla0).transformer;
      std::printf("[ memory   ] %s %s 128x128: a step held %lld bytes, estimated %lld\n", pipe->class_name(),
                  execution_mode_name(mode), static_cast<long long>(held), static_cast<long long>(estimate));
      EXPECT_GT(held, 0) << golden << " " << execution_mode_name(mode);
      EXPECT_GE(estimate, held) << golden << " " << execution_mode_name(mode);
    }
  }
}

// A budget the weights fit but not the activations beside them: the offload picked by the weights alone would
// run out of memory halfway (model offload holds a whole component), so each call plans with its own
// activations' estimate: a finer offload when one fits, else a refusal before any work that names the
// estimate and what to do. A later call at another size gets the plan its size needs.
TEST(OffloadOnDevice, AMemoryBudgetKeepsRoomForEachCallsActivations) {
  KILN_SKIP_WITHOUT_PJRT();
  const BudgetSetup setup = flux_budget_setup();
  const PipelineRequest& request = setup.request;
  const DeviceRun& resident = setup.resident;
  const std::unique_ptr<DiffusionPipeline>& pipe = setup.pipe;
  const OffloadPlan& sizes = setup.sizes;
  const int64_t group_minimum = group_offload_minimum(sizes);
  ASSERT_LT(group_minimum, sizes.largest_component_bytes);
  const int64_t activations = pipe->estimate_activations(request, xla0).peak();

  // The largest component fits (model offload, by the weights alone), but not with the activations beside
  // it: group offload, within the budget.
  const int64_t budget = group_minimum + activations + (sizes.largest_component_bytes - group_minimum) / 2;
  ASSERT_GT(budget, sizes.largest_component_bytes);
  pipe->set_memory_budget(budget, xla0);
  const DeviceRun limited = run(*pipe, request);
  EXPECT_EQ(pipe->device_memory_plan().value().mode, OffloadMode::Group)
      << pipe->device_memory_plan().value().describe();
  EXPECT_EQ(limited.pixels, resident.pixels);
  EXPECT_LE(memory_stats(xla0).peak_bytes, budget);

  // A larger image at the same budget: its activations leave too little even for one-block groups. Refused
  // before any work, naming the estimate; the device holds what it held.
  PipelineRequest larger = request;
  larger.height = larger.width = 256;
  const int64_t larger_activations = pipe->estimate_activations(larger, xla0).peak();
  ASSERT_GT(group_minimum + larger_activations, budget);
  const int64_t held = memory_stats(xla0).current_bytes;
  const std::string refused = testing::error_message([&] { (*pipe)(larger); });
  EXPECT_NE(refused.find("keeps up to"), std::string::npos) << refused;
  EXPECT_NE(refused.find("of activations at 256x256"), std::string::npos) << refused;
  EXPECT_NE(refused.find("a smaller image"), std::string::npos) << refused;
  EXPECT_EQ(memory_stats(xla0).current_bytes, held) << "the refused call put something on the device";

  // Room for the whole pipeline at 64x64: nothing offloaded. A budget for the larger image's activations and
  // one-block groups: group offload at its size, a coarser plan for the small image.
  const int64_t roomy = sizes.weight_bytes + activations;
  pipe->set_memory_budget(roomy, xla0);
  EXPECT_EQ(run(*pipe, request).pixels, resident.pixels);
  EXPECT_EQ(pipe->device_memory_plan().value().mode, OffloadMode::None);
  const int64_t larger_budget = group_minimum + larger_activations;
  pipe->set_memory_budget(larger_budget, xla0);
  (*pipe)(larger);
  EXPECT_EQ(pipe->device_memory_plan().value().mode, OffloadMode::Group);
  EXPECT_LE(memory_stats(xla0).peak_bytes, larger_budget);
  // Back to the small image under this budget: the plan follows the call.
  EXPECT_EQ(run(*pipe, request).pixels, resident.pixels);
  EXPECT_NE(pipe->device_memory_plan().value().mode, OffloadMode::Group);
}

// Kiln's limit on the device's memory, reached by a call: a kiln::Error naming the device, the bytes asked
// and held, and what to do; the pipeline works again once the limit is lifted.
TEST(OffloadOnDevice, RunningOutOfDeviceMemoryIsAnErrorNamingTheDevice) {
  KILN_SKIP_WITHOUT_PJRT();
  const io::SafetensorsFile g(testing::data_path("goldens/flux/schnell_cat_64x64_s0.safetensors"));
  const PipelineRequest request = testing::request_from_golden(g);
  auto pipe = load(g.metadata().at("pipeline"));
  pipe->enable_model_cpu_offload(xla0);
  {
    ExecutionScope in(pipe->context());
    set_memory_limit(xla0, current_device_ledger(xla0)->held() + 4096);
  }
  const std::string message = testing::error_message([&] { (*pipe)(request); });
  {
    ExecutionScope in(pipe->context());
    set_memory_limit(xla0, std::nullopt);
  }
  EXPECT_NE(message.find(xla0.str() + " is out of memory: "), std::string::npos) << message;
  EXPECT_NE(message.find(" needs "), std::string::npos) << message;
  EXPECT_NE(message.find("limit (--max-memory, kiln::set_memory_limit) already held"), std::string::npos)
      << message;
  EXPECT_NE(message.find("--offload model or group"), std::string::npos) << message;
  EXPECT_EQ((*pipe)(request).images.size(), 1u);

  EXPECT_NE(testing::error_message([&] { set_memory_limit(cpu, 1 << 20); }).find("cpu: a memory limit"),
            std::string::npos);
}

// Memory limits are each execution context's: contexts with different limits on one device keep their own, an
// array gives its bytes back to the context that made it, and two pipelines with different budgets there run
// side by side, each within its own.
TEST(OffloadOnDevice, EachContextKeepsItsOwnMemoryLimit) {
  KILN_SKIP_WITHOUT_PJRT();
  const auto a = ExecutionContext::create("context a"), b = ExecutionContext::create("context b");
  {
    ExecutionScope in(*a);
    set_memory_limit(xla0, 64 << 10);
  }
  {
    ExecutionScope in(*b);
    set_memory_limit(xla0, 1 << 20);
  }
  EXPECT_EQ(total_memory_limit(xla0), (64 << 10) + (1 << 20));
  // 256 KiB on xla0, allocated now (an empty tensor's bytes are otherwise allocated on first use).
  const auto allocated = [] {
    Tensor t = Tensor::empty({64 << 10}, float32, xla0);
    t.storage()->data();
    return t;
  };
  Tensor held_by_b;
  {
    // Past a's limit (naming it), within b's.
    ExecutionScope in(*a);
    const std::string refused = testing::error_message(allocated);
    EXPECT_NE(refused.find("64.0 KiB limit (--max-memory, kiln::set_memory_limit) already held in context a"),
              std::string::npos)
        << refused;
  }
  {
    ExecutionScope in(*b);
    held_by_b = allocated();
    EXPECT_EQ(current_device_ledger(xla0)->held(), 256 << 10);
  }
  {
    // Freed elsewhere, the bytes go back to b.
    ExecutionScope in(*a);
    held_by_b = Tensor();
    set_memory_limit(xla0, std::nullopt);  // a's lifted: b's stays
    EXPECT_NO_THROW(allocated());
  }
  {
    ExecutionScope in(*b);
    EXPECT_EQ(current_device_ledger(xla0)->held(), 0);
    EXPECT_EQ(memory_limit(xla0), 1 << 20);
  }
  EXPECT_EQ(total_memory_limit(xla0), 1 << 20);

  // Two pipelines, a roomy budget and a tight one on the same device, called at once: each keeps its plan and
  // its limit, and both give the resident image.
  BudgetSetup roomy = flux_budget_setup(), tight = flux_budget_setup();
  const int64_t activations = roomy.pipe->estimate_activations(roomy.request, xla0).peak();
  roomy.pipe->set_memory_budget(roomy.sizes.weight_bytes + activations, xla0);
  tight.pipe->set_memory_budget(tight.sizes.weight_bytes - 1 + activations, xla0);
  DeviceRun from_roomy, from_tight;
  std::thread other([&] { from_tight = run(*tight.pipe, tight.request); });
  from_roomy = run(*roomy.pipe, roomy.request);
  other.join();
  EXPECT_EQ(from_roomy.pixels, roomy.resident.pixels);
  EXPECT_EQ(from_tight.pixels, roomy.resident.pixels);
  EXPECT_EQ(roomy.pipe->device_memory_plan().value().mode, OffloadMode::None);
  EXPECT_NE(tight.pipe->device_memory_plan().value().mode, OffloadMode::None);
  EXPECT_EQ(limit_of(*roomy.pipe), roomy.sizes.weight_bytes + activations);
  EXPECT_EQ(limit_of(*tight.pipe), tight.sizes.weight_bytes - 1 + activations);
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
