// Attention on the cuda platform: scaled_dot_product_attention becomes XLA's cuDNN fused-attention custom
// call, written as JAX 0.11.2 writes it (tests/data/pjrt/jax_cudnn_attention_*.mlir, from
// tools/goldens/cudnn_attention.py): the same target, backend config (byte for byte), api version, operand
// and result layouts and types. Where cuDNN's flash attention does not apply (f32, a bias, a head dim it does
// not take), or with KILN_PJRT_FUSED_ATTENTION=0, the plain composition stays; other platforms never see
// the call. No GPU here: the CPU plugin only shows that the text parses (it has no cuDNN to run it).
// KILN_UPDATE_GOLDENS=1 regenerates Kiln's own golden, tests/data/pjrt/attention_cudnn_bf16.mlir.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "backends/pjrt/stablehlo/region_module.h"
#include "kiln/ops/attention.h"
#include "kiln/ops/elementwise.h"
#include "kiln/pipelines/activation_estimate.h"
#include "pjrt/stablehlo_test_support.h"
#include "support/pjrt_devices.h"
#include "support/scoped_env.h"
#include "support/test_data.h"

namespace kiln::pjrt::hlo {
namespace {

using kiln::testing::values;

const LoweringTarget kCuda{"cuda", true};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path << " is missing";
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The line of `text` holding the custom call, or "" when there is none.
std::string custom_call_line(const std::string& text) {
  const size_t at = text.find("\"stablehlo.custom_call\"");
  if (at == std::string::npos) return "";
  const size_t begin = text.rfind('\n', at) + 1, end = text.find('\n', at);
  return text.substr(begin, end - begin);
}

// The custom call's attributes and types: everything from `<{` on (operand names differ between modules).
std::string attributes_and_types(const std::string& line) {
  const size_t at = line.find("<{");
  return at == std::string::npos ? "" : line.substr(at);
}

runtime::OpCall attention_call(const Shape& shape, DType dtype, double scale, bool causal,
                               std::optional<Tensor> bias = std::nullopt) {
  const Tensor q = values(shape, 1, -1, 1, dtype), k = values(shape, 2, -1, 1, dtype),
               v = values(shape, 3, -1, 1, dtype);
  AttentionOptions options;
  options.scale = scale;
  options.is_causal = causal;
  if (bias) options.bias = *bias;
  auto calls = testing::capture_calls([&] { scaled_dot_product_attention(q, k, v, options); });
  EXPECT_FALSE(calls.empty());
  return calls.back();
}

void expect_as_jax(const std::string& jax_file, const Shape& shape, DType dtype, double scale, bool causal) {
  const std::string jax = read_text(kiln::testing::data_path("pjrt/" + jax_file));
  const std::string kiln = op_module(attention_call(shape, dtype, scale, causal), kCuda).text;
  const std::string jax_line = custom_call_line(jax), kiln_line = custom_call_line(kiln);
  ASSERT_NE(jax_line, "") << jax_file << " holds no custom call";
  ASSERT_NE(kiln_line, "") << "Kiln emitted no custom call:\n" << kiln;
  EXPECT_EQ(attributes_and_types(kiln_line), attributes_and_types(jax_line));
  // Two results (the output and the workspace), the output taken as the attention's value.
  EXPECT_NE(jax_line.find(":2 = \"stablehlo.custom_call\""), std::string::npos) << jax_line;
  EXPECT_NE(kiln_line.find(":2 = \"stablehlo.custom_call\""), std::string::npos) << kiln_line;
  const size_t name = kiln_line.find('%');
  const std::string result = kiln_line.substr(name, kiln_line.find(':') - name) + "#0";
  EXPECT_NE(kiln.find("(" + result), std::string::npos) << "the output " << result << " is not used:\n"
                                                        << kiln;
}

TEST(CudnnAttention, Bf16IsTheCustomCallJaxEmits) {
  expect_as_jax("jax_cudnn_attention_bf16.mlir", {1, 2, 128, 64}, bfloat16, 0.125, false);
}

TEST(CudnnAttention, F16CausalIsTheCustomCallJaxEmits) {
  expect_as_jax("jax_cudnn_attention_f16_causal.mlir", {2, 3, 16, 32}, float16, 0.3, true);
}

TEST(CudnnAttention, KilnsModuleTextIsPinned) {
  // q, k, v and the output held as a device holds them (in their own dims): the call takes its parameters
  // as they are.
  const std::string text =
      op_module(attention_call({1, 2, 8, 16}, bfloat16, 0.25, false), kCuda, array_dims_as_written).text;
  const std::string path = kiln::testing::data_path("pjrt/attention_cudnn_bf16.mlir");
  const char* update = std::getenv("KILN_UPDATE_GOLDENS");
  if (update != nullptr && std::string(update) == "1") std::ofstream(path, std::ios::binary) << text;
  EXPECT_EQ(text, read_text(path)) << "KILN_UPDATE_GOLDENS=1 regenerates " << path;
}

TEST(CudnnAttention, WhatCudnnDoesNotTakeKeepsThePlainComposition) {
  struct Case {
    const char* what;
    runtime::OpCall call;
  };
  const Case cases[] = {
      {"f32", attention_call({1, 2, 8, 16}, float32, 0.25, false)},
      {"a bias", attention_call({1, 2, 8, 16}, bfloat16, 0.25, false, values({8, 8}, 4, -1, 1, bfloat16))},
      {"head dim 12 (not a multiple of 8)", attention_call({1, 2, 8, 12}, bfloat16, 0.25, false)},
      {"head dim 136 (over 128)", attention_call({1, 1, 4, 136}, bfloat16, 0.25, false)},
  };
  for (const Case& c : cases) {
    const std::string on_cuda = op_module(c.call, kCuda).text;
    EXPECT_EQ(custom_call_line(on_cuda), "") << c.what;
    EXPECT_EQ(on_cuda, op_module(c.call).text) << c.what << ": the composition is the same on every platform";
  }
}

TEST(CudnnAttention, OnlyCudaGetsItAndTheSwitchTurnsItOff) {
  const runtime::OpCall call = attention_call({1, 2, 8, 16}, bfloat16, 0.25, false);
  const char* saved = std::getenv("KILN_PJRT_FUSED_ATTENTION");
  const std::optional<std::string> old = saved ? std::optional<std::string>(saved) : std::nullopt;
  unsetenv("KILN_PJRT_FUSED_ATTENTION");
  EXPECT_TRUE(lowering_target("cuda").cudnn_attention);
  EXPECT_FALSE(lowering_target("cpu").cudnn_attention);
  EXPECT_FALSE(lowering_target("tpu").cudnn_attention);
  EXPECT_EQ(custom_call_line(op_module(call, lowering_target("cpu")).text), "");
  EXPECT_NE(custom_call_line(op_module(call, lowering_target("cuda")).text), "");
  setenv("KILN_PJRT_FUSED_ATTENTION", "0", 1);
  EXPECT_EQ(op_module(call, lowering_target("cuda")).text, op_module(call).text);
  setenv("KILN_PJRT_FUSED_ATTENTION", "1", 1);
  EXPECT_TRUE(lowering_target("cuda").cudnn_attention);
  setenv("KILN_PJRT_FUSED_ATTENTION", "yes", 1);
  const std::string e = kiln::testing::error_message([] { (void)lowering_target("cuda"); });
  EXPECT_NE(e.find("KILN_PJRT_FUSED_ATTENTION must be 0"), std::string::npos) << e;
  if (old)
    setenv("KILN_PJRT_FUSED_ATTENTION", old->c_str(), 1);
  else
    unsetenv("KILN_PJRT_FUSED_ATTENTION");
}

// A memory budget's activation estimate leaves the scores out exactly where the lowering emits cuDNN's call:
// it asks the device's backend, which applies the lowering's own rule.
TEST(CudnnAttention, TheActivationEstimateFollowsTheLoweringsRule) {
  const char* saved = std::getenv("KILN_PJRT_FUSED_ATTENTION");
  const std::optional<std::string> old = saved ? std::optional<std::string>(saved) : std::nullopt;
  unsetenv("KILN_PJRT_FUSED_ATTENTION");
  const Device cuda("cuda");
  EXPECT_TRUE(fuses_attention(cuda, bfloat16, 128));
  EXPECT_TRUE(fuses_attention(cuda, float16, 64));
  EXPECT_FALSE(fuses_attention(cuda, float32, 128));
  EXPECT_FALSE(fuses_attention(cuda, bfloat16, 12));
  EXPECT_FALSE(fuses_attention(cuda, bfloat16, 136));
  EXPECT_FALSE(fuses_attention(Device("xla-cpu"), bfloat16, 128));
  EXPECT_FALSE(fuses_attention(cpu, bfloat16, 128));
  setenv("KILN_PJRT_FUSED_ATTENTION", "0", 1);
  EXPECT_FALSE(fuses_attention(cuda, bfloat16, 128));
  if (old)
    setenv("KILN_PJRT_FUSED_ATTENTION", old->c_str(), 1);
  else
    unsetenv("KILN_PJRT_FUSED_ATTENTION");
}

// A TPU's attention over key blocks (lowering_target.h) in the estimate: one block's scores, not all of them.
TEST(CudnnAttention, TheActivationEstimateCountsOneKeyBlockOnATpu) {
  kiln::testing::ScopedEnv env;
  env.set("KILN_PJRT_ATTENTION_KEY_BLOCK", std::nullopt);
  env.set("KILN_PJRT_FUSED_ATTENTION", std::nullopt);
  const Device tpu("tpu");
  EXPECT_EQ(attention_key_block(tpu, bfloat16, 128), 256);
  EXPECT_EQ(attention_key_block(Device("cuda"), bfloat16, 128), 0) << "cuDNN's fused attention holds none";
  EXPECT_EQ(attention_key_block(Device("cuda"), float32, 128), 0)
      << "composed whole where cuDNN does not take it";
  EXPECT_EQ(attention_key_block(cpu, bfloat16, 128), 0);
  BlockStackShape shape{.tokens = 4608, .width = 3072, .mlp_width = 12288, .heads = 24};
  const int64_t whole = block_stack_activation_bytes(shape, bfloat16);
  shape.attention_key_block = attention_key_block(tpu, bfloat16, 128);
  const int64_t blocks = block_stack_activation_bytes(shape, bfloat16);
  const int64_t scores = int64_t{24} * 4608 * 4608 * 6;  // f32 scores and bf16 probabilities
  EXPECT_EQ(whole - blocks, scores - scores / 4608 * 256);
  env.set("KILN_PJRT_ATTENTION_KEY_BLOCK", "0");
  EXPECT_EQ(attention_key_block(tpu, bfloat16, 128), 0);
}

// Compiled and deferred-and-fused modes lower through region_module: attention inside a chain is the call
// too.
TEST(CudnnAttention, RegionsUseItToo) {
  const Tensor q = values({1, 2, 8, 16}, 1, -1, 1, bfloat16);
  runtime::DeviceRegion region;
  region.calls = testing::capture_calls([&] { exp(scaled_dot_product_attention(mul(q, 2.0), q, q)); });
  for (const runtime::OpCall& c : region.calls) region.stored.emplace_back(c.outputs.size(), true);
  EXPECT_NE(custom_call_line(region_module(region, kCuda).text), "");
  EXPECT_EQ(custom_call_line(region_module(region).text), "");
}

// The CPU plugin (XLA 0.11.2, as the CUDA plugin on the GPU machines) parses the module: compiling it fails
// only because XLA's CPU compiler has no cuDNN custom call, never as a parse error.
TEST(CudnnAttention, TheCpuPluginParsesTheText) {
  std::string why;
  auto client = testing::shared_client(&why);
  if (!client) GTEST_SKIP() << why;
  const std::string text = op_module(attention_call({1, 2, 8, 16}, bfloat16, 0.25, false), kCuda).text;
  const std::string e = kiln::testing::error_message([&] { (void)client->compile(text); });
  EXPECT_EQ(e.find("parse"), std::string::npos) << e;
  EXPECT_NE(e.find("__cudnn$fmhaSoftmax"), std::string::npos) << e;
  RecordProperty("cpu_plugin_says", e);
}

}  // namespace
}  // namespace kiln::pjrt::hlo
