// Compiling for devices this host does not have (cross_compile.h, cross_targets.h, pjrt_topology.h), and the
// TPU host check (tpu_host.h). The compiling tests need libtpu and the CUDA plugin where cross_targets.h
// looks
// (./scripts/fetch_pjrt.sh --cross puts them in Kiln's cache; CI has them); the CUDA ones also need the CUDA
// toolkit's ptxas. Without them those tests skip, saying what is missing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/pjrt/cross_compile.h"
#include "backends/pjrt/cross_targets.h"
#include "backends/pjrt/pjrt_client.h"
#include "backends/pjrt/stablehlo/collective_module.h"
#include "backends/pjrt/stablehlo/op_module.h"
#include "backends/pjrt/tpu_host.h"
#include "kiln/core/tensor.h"
#include "kiln/ops.h"
#include "kiln/runtime/cross_compile.h"
#include "runtime/capture.h"
#include "runtime/op_call.h"
#include "support/pjrt_devices.h"
#include "support/scoped_env.h"
#include "support/test_data.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::error_message;

using testing::ScopedEnv;

fs::path temp_folder(const char* name) {
  return testing::temp_folder("kiln-cross", name);
}

// The target `name`, or the reason it cannot be made here (the test then skips).
std::optional<pjrt::CrossTarget> target_or_why(const std::string& name, std::string* why) {
  if (!pjrt::built_with_pjrt()) {
    *why = "this build has no PJRT support";
    return std::nullopt;
  }
  if (name.starts_with("cuda:")) {
    std::error_code ec;
    const bool ptxas =
        fs::exists("/usr/local/cuda/bin/ptxas", ec) || std::system("command -v ptxas >/dev/null") == 0;
    if (!ptxas) {
      *why = "the CUDA plugin compiles with the CUDA toolkit's ptxas, which this host lacks";
      return std::nullopt;
    }
  }
  try {
    return pjrt::cross_target(name);
  } catch (const Error& e) {
    *why = e.what();
    return std::nullopt;
  }
}

#define TARGET_OR_SKIP(var, name)                   \
  std::string why_##var;                            \
  const auto var = target_or_why(name, &why_##var); \
  if (!var) GTEST_SKIP() << name << ": " << why_##var

std::string read_golden(const std::string& name) {
  std::ifstream in(testing::data_path("pjrt/" + name + ".mlir"));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Kiln's golden modules for plain ops (tests/pjrt/stablehlo_golden_test.cpp keeps them current).
const std::vector<std::string> kPlainGoldens = {
    "add_broadcast",    "attention_causal", "copy_transposed_into_narrow",
    "linear_bf16_bias", "region_chain",     "softmax"};

// ---- the TPU host check

TEST(TpuHost, CountsThePciDevicesOfGooglesVendorId) {
  const fs::path pci = temp_folder("pci");
  const std::map<std::string, std::string> vendors = {{"0000:00:04.0", "0x1ae0"},
                                                      {"0000:00:05.0", "0x1ae0"},
                                                      {"0000:00:06.0", "0x8086"},
                                                      {"0000:00:07.0", "0x1af4"}};
  for (const auto& [slot, vendor] : vendors) {
    fs::create_directories(pci / slot);
    std::ofstream(pci / slot / "vendor") << vendor << "\n";
  }
  fs::create_directories(pci / "0000:00:08.0");  // no vendor file: not counted
  EXPECT_EQ(pjrt::tpu_chip_count(pci.string()), 2);
  EXPECT_EQ(pjrt::tpu_chip_count((pci / "missing").string()), 0);
  fs::remove_all(pci);
}

TEST(TpuHost, WithoutChipsLibtpuIsNotLoadedAndTheErrorSaysWhy) {
  if (pjrt::tpu_chip_count() > 0) GTEST_SKIP() << "this host has TPU chips";
  ScopedEnv env;
  env.set("KILN_PJRT_TPU_CHIP_CHECK", std::nullopt);
  const std::string message = error_message([] { pjrt::require_tpu_chips("/somewhere/libtpu.so"); });
  EXPECT_NE(message.find("this host has no TPU chips"), std::string::npos) << message;
  EXPECT_NE(message.find("0x1ae0"), std::string::npos) << message;
  EXPECT_NE(message.find("KILN_PJRT_CROSS_COMPILE=tpu:v5e"), std::string::npos) << message;
  // `--device tpu` says the same, instead of libtpu waiting minutes for a metadata server: a fake libtpu
  // (any file) stands for an installed one.
  const fs::path dir = temp_folder("libtpu");
  std::ofstream(dir / "libtpu.so") << "not loaded";
  env.set("KILN_PJRT_PLUGIN_DIR", dir.string());
  const std::string from_device = error_message([] { (void)Tensor::zeros({2}).to(Device("tpu")); });
  EXPECT_NE(from_device.find("this host has no TPU chips"), std::string::npos) << from_device;
  env.set("KILN_PJRT_TPU_CHIP_CHECK", "0");
  EXPECT_NO_THROW(pjrt::require_tpu_chips("/somewhere/libtpu.so"));
  fs::remove_all(dir);
}

// ---- targets

TEST(CrossTargets, AnUnknownNameIsRefusedListingTheKnownOnes) {
  for (const char* name : {"tpu:v9", "rocm:mi300", "cuda:gtx480", "h200", "tpu:v5e:2x2:extra"}) {
    const std::string message = error_message([&] { pjrt::cross_target(name); });
    EXPECT_NE(message.find(std::string("cross-compile target '") + name + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("tpu:v5e"), std::string::npos) << message;
    EXPECT_NE(message.find("cuda:h200"), std::string::npos) << message;
  }
  EXPECT_NE(error_message([] { pjrt::cross_target("cuda:h100:0"); }).find("GPU count must be 1 to 64"),
            std::string::npos);
  const std::vector<std::string> known = pjrt::known_cross_targets();
  EXPECT_NE(std::find(known.begin(), known.end(), "cuda:l4"), known.end());
  EXPECT_NE(std::find(known.begin(), known.end(), "tpu:v6e"), known.end());
}

TEST(CrossTargets, TheListIsReadFromTheEnvironmentIgnoringSpaces) {
  ScopedEnv env;
  env.set("KILN_PJRT_CROSS_COMPILE", std::nullopt);
  EXPECT_TRUE(pjrt::cross_compile_targets().empty());
  env.set("KILN_PJRT_CROSS_COMPILE", " tpu:v5e , cuda:h200,, ");
  EXPECT_EQ(pjrt::cross_compile_targets(), (std::vector<std::string>{"tpu:v5e", "cuda:h200"}));
}

TEST(CrossTargets, AMissingPluginIsNamedWithWhereItWasLookedForAndHowToGetIt) {
  ScopedEnv env;
  const fs::path empty = temp_folder("empty");
  for (const char* name : {"VIRTUAL_ENV", "PYTHONPATH", "KILN_PJRT_PLUGIN_DIR"}) env.set(name, std::nullopt);
  env.set("KILN_CACHE_DIR", empty.string());
  env.set("HOME", empty.string());
  env.set("PATH", empty.string());
  const std::string message = error_message([] { pjrt::find_cross_plugin("tpu"); });
  EXPECT_NE(message.find("no libtpu.so found"), std::string::npos) << message;
  EXPECT_NE(message.find("fetch_pjrt.sh --cross"), std::string::npos) << message;
  EXPECT_NE(message.find((empty / "pjrt" / "cross" / "libtpu.so").string()), std::string::npos) << message;
  fs::remove_all(empty);
}

// ---- compiling without the device

TEST(CrossCompile, TpuCompilesKilnsModulesAndReportsTheirMemory) {
  TARGET_OR_SKIP(tpu, "tpu:v5e");
  EXPECT_EQ(tpu->platform, "tpu");
  EXPECT_EQ(tpu->topology->platform_name(), "tpu");
  EXPECT_EQ(tpu->topology->device_count(), 4);
  EXPECT_EQ(tpu->topology->device_kind(), "TPU v5 lite");
  for (const std::string& name : kPlainGoldens) {
    const pjrt::TargetProgram p = tpu->topology->compile(read_golden(name));
    EXPECT_GT(p.code_bytes, 0) << name;  // TPU machine code was generated
    EXPECT_GT(p.output_bytes, 0) << name;
    EXPECT_GT(p.serialized_bytes, 0u) << name;
  }
  // A collective between 2 and 4 chips (the in-process ranks' modules).
  const Tensor x = Tensor::empty({4}, bfloat16, cpu);
  runtime::OpCall call{"all_reduce_sum", {x}, {Tensor::empty({4}, bfloat16, cpu)}, {}, false};
  EXPECT_GT(tpu->topology->compile(pjrt::hlo::collective_module(call, 2), 2).code_bytes, 0);
  EXPECT_GT(tpu->topology->compile(pjrt::hlo::collective_module(call, 4), 4).code_bytes, 0);
  EXPECT_NE(error_message([&] {
              tpu->topology->compile(pjrt::hlo::collective_module(call, 8), 8);
            }).find("8 replicas x 1 partitions do not fit its 4 devices"),
            std::string::npos);
}

// Why device storages are matrices, not flat (storage_views.h): FLUX's single-block projection on a TPU. Its
// weight held flat is relaid out into scratch at every call (twice its size); held as [out, in] it is read
// as it is. And an innermost dim of 3 is padded to 4 there, so a 3x3 convolution's weight stays flat.
TEST(CrossCompile, OnATpuAWeightHeldAsAMatrixNeedsNoRelayout) {
  TARGET_OR_SKIP(tpu, "tpu:v5e");
  const Tensor x = Tensor::empty({1, 3072}, bfloat16, cpu), w = Tensor::empty({18432, 3072}, bfloat16, cpu);
  std::vector<runtime::OpCall> calls;  // linear's call, captured from its front end, not run
  {
    runtime::CaptureGuard capture(&calls);
    linear(x, w);
  }
  ASSERT_EQ(calls.size(), 1u);
  const runtime::OpCall& call = calls[0];
  const int64_t weight_bytes = int64_t{18432} * 3072 * 2;
  const pjrt::TargetProgram shaped =
      tpu->topology->compile(pjrt::hlo::op_module(call, {}, pjrt::hlo::array_dims_as_written).text);
  EXPECT_EQ(shaped.scratch_bytes, 0);
  const pjrt::TargetProgram flat =
      tpu->topology->compile(pjrt::hlo::op_module(call, {}, pjrt::hlo::flat_array_dims).text);
  EXPECT_GE(flat.scratch_bytes, weight_bytes) << "libtpu no longer relays out a flat weight: the reason for "
                                                 "matrices is gone, see storage_views.h";
  // [O, I, 3, 3] as a [O * I * 3, 3] matrix would be padded; flat, it takes its size.
  EXPECT_EQ(pjrt::hlo::device_array_dims({512, 512, 3, 3}), Shape({512 * 512 * 9}));
  auto argument_bytes = [&](const std::string& type) {
    const std::string module =
        "module @m {\n  func.func public @main(%arg0: tensor<" + type + ">) -> (tensor<" + type +
        ">) {\n    %0 = \"stablehlo.negate\"(%arg0) : (tensor<" + type + ">) -> tensor<" + type +
        ">\n    \"func.return\"(%0) : (tensor<" + type + ">) -> ()\n  }\n}\n";
    return tpu->topology->compile(module).argument_bytes;
  };
  EXPECT_EQ(argument_bytes("2359296xbf16"), 2359296 * 2);
  EXPECT_GT(argument_bytes("786432x3xbf16"), 2359296 * 2);
}

// A TPU gets no fused attention: over blocks of keys (lower_fused.cpp) it holds a block's scores at most
// instead of them all. FLUX's attention at 512x512 (24 heads, 1536 tokens, bf16).
TEST(CrossCompile, OnATpuAttentionOverKeyBlocksHoldsNoWholeScores) {
  TARGET_OR_SKIP(tpu, "tpu:v5e");
  const Tensor q = Tensor::empty({1, 24, 1536, 128}, bfloat16, cpu);
  std::vector<runtime::OpCall> calls;
  {
    runtime::CaptureGuard capture(&calls);
    scaled_dot_product_attention(q, q, q, {});
  }
  ASSERT_FALSE(calls.empty());
  const int64_t whole_scores = int64_t{24} * 1536 * 1536 * 4;
  ScopedEnv env;
  env.set("KILN_PJRT_ATTENTION_KEY_BLOCK", std::nullopt);
  const pjrt::TargetProgram blocks = tpu->topology->compile(
      pjrt::hlo::op_module(calls.back(), pjrt::hlo::lowering_target("tpu"), pjrt::hlo::array_dims_as_written)
          .text);
  env.set("KILN_PJRT_ATTENTION_KEY_BLOCK", "0");
  const pjrt::TargetProgram composed = tpu->topology->compile(
      pjrt::hlo::op_module(calls.back(), pjrt::hlo::lowering_target("tpu"), pjrt::hlo::array_dims_as_written)
          .text);
  EXPECT_GE(composed.scratch_bytes, whole_scores);
  EXPECT_LE(blocks.scratch_bytes, whole_scores / 6) << "one block of 256 keys is a sixth of the scores";
}

TEST(CrossCompile, TheTpuCompilerRefusesCudnnAttentionByName) {
  TARGET_OR_SKIP(tpu, "tpu:v5e");
  const std::string message =
      error_message([&] { tpu->topology->compile(read_golden("attention_cudnn_bf16")); });
  EXPECT_NE(message.find("PJRT_Compile for v5e:2x2"), std::string::npos) << message;
  EXPECT_NE(message.find("cudnn"), std::string::npos) << message;
}

TEST(CrossCompile, TheCudaPluginCompilesKilnsModulesAndCudnnAttentionForAnH200) {
  TARGET_OR_SKIP(gpu, "cuda:h200");
  EXPECT_EQ(gpu->platform, "cuda");
  EXPECT_EQ(gpu->topology->device_count(), 4);
  EXPECT_EQ(gpu->topology->device_kind(), "NVIDIA H200");
  std::vector<std::string> names = kPlainGoldens;
  for (const char* cudnn :
       {"attention_cudnn_bf16", "jax_cudnn_attention_bf16", "jax_cudnn_attention_f16_causal"})
    names.push_back(cudnn);
  for (const std::string& name : names) {
    const pjrt::TargetProgram p = gpu->topology->compile(read_golden(name));
    EXPECT_GE(p.scratch_bytes, 0) << name;
    EXPECT_GT(p.serialized_bytes, 0u) << name;
  }
  const Tensor x = Tensor::empty({4}, float32, cpu);
  runtime::OpCall call{"all_reduce_sum", {x}, {Tensor::empty({4}, float32, cpu)}, {}, false};
  EXPECT_GT(gpu->topology->compile(pjrt::hlo::collective_module(call, 4), 4).serialized_bytes, 0u);
  // Another GPU generation from the same plugin.
  TARGET_OR_SKIP(l4, "cuda:l4:1");
  EXPECT_EQ(l4->topology->device_count(), 1);
  EXPECT_GT(l4->topology->compile(read_golden("linear_bf16_bias")).serialized_bytes, 0u);
}

// Ops run on the CPU plugin with KILN_PJRT_CROSS_COMPILE set are compiled for the targets once per distinct
// program, and a program a target refuses stops the run naming both.
TEST(CrossCompile, EveryNewProgramARunCompilesIsAlsoCompiledForTheTargets) {
  KILN_SKIP_WITHOUT_TEST_DEVICES(1);
  TARGET_OR_SKIP(tpu, "tpu:v5e");
  ScopedEnv env;
  env.set("KILN_PJRT_CROSS_COMPILE", "tpu:v5e");
  reset_cross_compile_summary();
  const Device device = testing::test_device(0);
  const auto run = [&](int64_t n) {
    const Tensor a = Tensor::from_vector(std::vector<float>(size_t(n * n), 0.5f), {n, n}).to(device);
    return softmax(matmul(a, a), 1).to(cpu).to_vector<float>();  // waits for the run
  };
  const std::vector<float> first = run(8);
  const std::vector<CrossCompileSummary> after_first = cross_compile_summary();
  ASSERT_EQ(after_first.size(), 1u);
  EXPECT_EQ(after_first[0].target, "tpu:v5e");
  EXPECT_EQ(after_first[0].device_kind, "TPU v5 lite");
  EXPECT_GE(after_first[0].programs, 2);  // the product and the softmax at least
  EXPECT_GT(after_first[0].largest_program_bytes, 0);
  (void)run(8);  // the same programs: nothing new to compile
  EXPECT_EQ(cross_compile_summary()[0].programs, after_first[0].programs);
  (void)run(16);  // new shapes: new programs
  EXPECT_GT(cross_compile_summary()[0].programs, after_first[0].programs);
  EXPECT_FLOAT_EQ(first[0], 0.125f);  // cross-compiling changes nothing of the run

  env.set("KILN_PJRT_CROSS_COMPILE", "tpu:v42");
  const std::string message = error_message([&] { (void)run(24); });
  EXPECT_NE(message.find("cross-compile target 'tpu:v42'"), std::string::npos) << message;
  reset_cross_compile_summary();
}

}  // namespace
}  // namespace kiln
