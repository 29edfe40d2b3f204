// scaled_dot_product_attention against torch (tools/kernel_refs/attention.py ->
// tests/data/kernels/attention.safetensors), in float32, bfloat16 and float16, through the public op and
// through both ISA variants of the CPU kernel; layouts, empty shapes and argument errors.
#include "kiln/ops/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/attention_tile.h"
#include "backends/cpu/cpu_features.h"
#include "kiln/core/device_runtime.h"
#include "kiln/io/safetensors.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using cpu_kernels::cpu_features;

const io::SafetensorsFile& refs() {
  static const io::SafetensorsFile file(testing::data_path("kernels/attention.safetensors"));
  return file;
}

// One reference case, as described in the file's metadata by attention.py.
struct Case {
  std::string name, q_set, kv_set, bias;
  std::optional<double> scale;
  bool causal = false, f16 = false;
};

std::vector<Case> cases() {
  const auto& meta = refs().metadata();
  std::vector<Case> out;
  std::stringstream names(meta.at("cases"));
  for (std::string name; std::getline(names, name, ',');) {
    std::map<std::string, std::string> fields;
    std::stringstream desc(meta.at(name));
    for (std::string field; desc >> field;) {
      const auto eq = field.find('=');
      fields[field.substr(0, eq)] = field.substr(eq + 1);
    }
    Case c;
    c.name = name;
    c.q_set = fields.at("inputs");
    c.kv_set = fields.at("kv");
    c.bias = fields.at("bias");
    if (fields.at("scale") != "default") c.scale = std::stod(fields.at("scale"));
    c.causal = fields.at("causal") == "1";
    c.f16 = fields.at("f16") == "1";
    out.push_back(c);
  }
  return out;
}

struct Inputs {
  Tensor q, k, v, bias;
};

Inputs inputs(const Case& c, DType dtype) {
  Inputs in{refs().tensor(c.q_set + ".q").to(dtype),
            refs().tensor(c.kv_set + ".k").to(dtype),
            refs().tensor(c.kv_set + ".v").to(dtype),
            {}};
  if (c.bias != "none") in.bias = refs().tensor("bias." + c.bias);
  return in;
}

AttentionOptions options(const Case& c, const Tensor& bias) {
  AttentionOptions o;
  o.scale = c.scale;
  o.is_causal = c.causal;
  o.bias = bias;
  return o;
}

// The CPU kernel with a chosen ISA variant and tiling, prepared the way the front end prepares it.
Tensor run_variant(const Inputs& in, const Case& c, cpu_kernels::AttnKernel kernel,
                   const cpu_kernels::AttentionTiling& tiling = {}) {
  const Shape scores{in.q.size(0), in.q.size(1), in.q.size(2), in.k.size(2)};
  Tensor out = Tensor::empty({in.q.size(0), in.q.size(1), in.q.size(2), in.v.size(3)}, in.q.dtype());
  const double scale = c.scale.value_or(1.0 / std::sqrt(static_cast<double>(in.q.size(3))));
  synchronize();  // the inputs come from ops that may still be queued on the stream; the kernel reads them
                  // now
  cpu_kernels::attention_forward(in.q, in.k, in.v, in.bias.defined() ? in.bias.expand(scores) : Tensor(), out,
                                 scale, c.causal, kernel, tiling);
  return out;
}

// The variants a test runs: the portable one always, the AVX-512 one where the CPU has it, and for bf16 the
// AVX-512 one on AMX tiles where the CPU has them.
std::vector<cpu_kernels::AttnKernel> variants(DType dtype) {
  std::vector<cpu_kernels::AttnKernel> v{cpu_kernels::AttnKernel::Generic};
  if (cpu_features().avx512 && cpu_features().avx512_bf16) v.push_back(cpu_kernels::AttnKernel::Avx512);
  if (dtype == bfloat16 && cpu_features().avx512 && cpu_features().avx512_bf16 && cpu_kernels::amx_usable()) {
    v.push_back(cpu_kernels::AttnKernel::Amx);
  }
  return v;
}

// The two tilings the front end picks (default_attn_tiling) and small ones, so that the reference cases (at
// most 300 keys) cross many query-tile and key-tile edges: the online rescale, tiles skipped or cut by the
// causal mask, ragged last tiles.
const std::vector<cpu_kernels::AttentionTiling> kTilings{
    cpu_kernels::AttentionTiling{}, cpu_kernels::kWideTiling, {5, 16}, {16, 48}, {40, 112}};

std::string tiling_name(const cpu_kernels::AttentionTiling& t) {
  return std::to_string(t.query_tile) + "x" + std::to_string(t.key_tile);
}

const char* variant_name(cpu_kernels::AttnKernel kernel) {
  return cpu_kernels::attn_kernel_name(kernel);
}

TEST(Attention, ReferenceFileListsEveryCase) {
  const auto all = cases();
  EXPECT_EQ(all.size(), 13u);
  for (const Case& c : all) EXPECT_TRUE(refs().contains(c.name + ".f32")) << c.name;
}

// Float32 inputs run float32 math throughout, so only the summation order differs from torch.
TEST(Attention, Float32MatchesTorch) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = inputs(c, float32);
    const Tensor expected = refs().tensor(c.name + ".f32");
    const Tensor out = scaled_dot_product_attention(in.q, in.k, in.v, options(c, in.bias));
    EXPECT_EQ(out.dtype(), float32);
    EXPECT_TRUE(testing::rel_max_error_within(out, expected, 1e-5));
    for (auto kernel : variants(float32)) {
      for (const auto& tiling : kTilings) {
        SCOPED_TRACE(std::string(variant_name(kernel)) + " " + tiling_name(tiling));
        EXPECT_TRUE(testing::rel_max_error_within(run_variant(in, c, kernel, tiling), expected, 1e-5));
      }
    }
  }
}

// bfloat16 follows torch's recipe: bfloat16 q, k multiplied in float32, a float32 softmax, probabilities
// rounded to bfloat16 for the product with v, the output rounded to bfloat16. With the bfloat16 unit
// roundoff u = 2^-8 that bounds each output against the exact result of the same inputs (the float32
// reference): rounding each probability p_j moves sum_j p_j v_j / sum_j p_j by at most
// u * sum_j p_j |v_j| / sum_j p_j = u * attention(q, k, |v|), and rounding the output adds at most u * |out|.
//   |out - ref| <= u * (attention(q, k, |v|) + |ref|)     (computed per element, +1% and 1e-5 for float32
//   noise)
// A wrong mask, scale or rescale moves outputs far outside it. Torch's own bfloat16 output meets the same
// bound, so the two also agree to within about one bfloat16 ulp of the largest output (2^-7 relative).
::testing::AssertionResult within_bf16_bound(const Tensor& out, const Tensor& ref,
                                             const Tensor& abs_attention) {
  const auto o = out.to_vector<double>(), r = ref.to_vector<double>(), a = abs_attention.to_vector<double>();
  constexpr double u = 1.0 / 256;
  for (size_t i = 0; i < o.size(); ++i) {
    const double bound = 1.01 * u * (a[i] + std::abs(r[i])) + 1e-5;
    if (!(std::abs(o[i] - r[i]) <= bound)) {
      return ::testing::AssertionFailure() << "element " << i << ": " << o[i] << " vs reference " << r[i]
                                           << ", error " << std::abs(o[i] - r[i]) << " > bound " << bound;
    }
  }
  return ::testing::AssertionSuccess();
}

Tensor abs_values(const Tensor& t) {
  auto v = t.to_vector<float>();
  for (float& x : v) x = std::abs(x);
  return Tensor::from_vector(v, t.shape());
}

TEST(Attention, BFloat16MatchesTorch) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = inputs(c, bfloat16);
    const Tensor torch_bf16 = refs().tensor(c.name + ".bf16");
    const Tensor reference = refs().tensor(c.name + ".f32");
    const Inputs f32 = inputs(c, float32);
    const Tensor abs_attention =
        scaled_dot_product_attention(f32.q, f32.k, abs_values(f32.v), options(c, f32.bias));
    ASSERT_TRUE(within_bf16_bound(torch_bf16, reference, abs_attention));  // the bound holds for torch too

    const Tensor out = scaled_dot_product_attention(in.q, in.k, in.v, options(c, in.bias));
    EXPECT_EQ(out.dtype(), bfloat16);
    std::vector<std::pair<std::string, Tensor>> outputs{{"op", out}};
    for (auto kernel : variants(bfloat16)) {
      for (const auto& tiling : kTilings) {
        outputs.emplace_back(std::string(variant_name(kernel)) + " " + tiling_name(tiling),
                             run_variant(in, c, kernel, tiling));
      }
    }
    for (const auto& [name, o] : outputs) {
      SCOPED_TRACE(name);
      EXPECT_TRUE(within_bf16_bound(o, reference, abs_attention));
      EXPECT_TRUE(testing::rel_max_error_within(o, torch_bf16, 1.0 / 128));
    }
  }
}

// float16 runs in float32 and rounds the output once: within an f16 ulp (2^-10) of the float32 reference.
TEST(Attention, Float16IsFloat32RoundedOnce) {
  int checked = 0;
  for (const Case& c : cases()) {
    if (!c.f16) continue;
    SCOPED_TRACE(c.name);
    const Inputs in = inputs(c, float16);
    const Tensor out = scaled_dot_product_attention(in.q, in.k, in.v, options(c, in.bias));
    EXPECT_EQ(out.dtype(), float16);
    EXPECT_TRUE(testing::all_close(out, refs().tensor(c.name + ".f32"), 1.0 / 1024, 1e-4));
    EXPECT_TRUE(testing::rel_max_error_within(out, refs().tensor(c.name + ".f16"), 2e-3));
    for (auto kernel : variants(float16)) {
      SCOPED_TRACE(variant_name(kernel));
      EXPECT_TRUE(
          testing::all_close(run_variant(in, c, kernel), refs().tensor(c.name + ".f32"), 1.0 / 1024, 1e-4));
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// q, k, v as heads split out of a [B, S, H, D + 3] buffer (rows D + 3 apart, heads interleaved), and as
// slices of one fused [B, S, 3, H, D] qkv buffer: read in place, they give exactly the contiguous result,
// and the output follows q's layout like torch's.
TEST(Attention, StridedViewsGiveTheContiguousResult) {
  auto head_split_padded = [](const Tensor& t) {
    const int64_t b = t.size(0), h = t.size(1), s = t.size(2), d = t.size(3);
    Tensor buffer = Tensor::zeros({b, s, h, d + 3}, t.dtype());
    buffer.narrow(3, 0, d).copy_(t.permute({0, 2, 1, 3}));
    return buffer.narrow(3, 0, d).permute({0, 2, 1, 3});
  };
  for (DType dtype : {float32, bfloat16}) {
    for (const std::string name : {"masked", "long"}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + name);
      const Case c{name, name, name, "none", std::nullopt, name == "long", false};
      const Inputs in = inputs(c, dtype);
      const Tensor expected = scaled_dot_product_attention(in.q, in.k, in.v, options(c, {}));
      const Tensor q = head_split_padded(in.q), k = head_split_padded(in.k), v = head_split_padded(in.v);
      ASSERT_FALSE(q.is_contiguous());
      const Tensor out = scaled_dot_product_attention(q, k, v, options(c, {}));
      EXPECT_TRUE(testing::all_close(out, expected, 0, 0));
      EXPECT_EQ(out.shape(), expected.shape());
      if (q.size(1) > 1) {
        // [B, H, Sq, Dv] viewed from [B, Sq, H, Dv] memory.
        EXPECT_EQ(out.stride(3), 1);
        EXPECT_EQ(out.stride(1), out.size(3));
        EXPECT_EQ(out.stride(2), out.size(1) * out.size(3));
      }
    }
  }
  for (DType dtype : {float32, bfloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Case c{"clip", "clip", "clip", "none", std::nullopt, true, false};
    const Inputs in = inputs(c, dtype);
    const Tensor expected = scaled_dot_product_attention(in.q, in.k, in.v, options(c, {}));
    const int64_t b = in.q.size(0), h = in.q.size(1), s = in.q.size(2), d = in.q.size(3);
    Tensor fused = Tensor::empty({b, s, 3, h, d}, dtype);
    fused.select(2, 0).copy_(in.q.permute({0, 2, 1, 3}));
    fused.select(2, 1).copy_(in.k.permute({0, 2, 1, 3}));
    fused.select(2, 2).copy_(in.v.permute({0, 2, 1, 3}));
    auto part = [&](int64_t i) { return fused.select(2, i).permute({0, 2, 1, 3}); };
    ASSERT_FALSE(part(1).is_contiguous());
    EXPECT_TRUE(testing::all_close(scaled_dot_product_attention(part(0), part(1), part(2), options(c, {})),
                                   expected, 0, 0));
  }
}

// A bias broadcast along its columns (one value per query row) adds a constant to a row, which softmax
// ignores; a stride-0 column must still be read as that constant and not as a vector.
TEST(Attention, RowConstantBiasChangesNothing) {
  const Case c{"clip", "clip", "clip", "none", std::nullopt, false, false};
  const Inputs in = inputs(c, float32);
  std::vector<float> per_row(static_cast<size_t>(in.q.size(2)));
  for (size_t i = 0; i < per_row.size(); ++i) per_row[i] = static_cast<float>(i) * 3.5f - 40.0f;
  const Tensor bias = Tensor::from_vector(per_row, {in.q.size(2), 1});
  const Tensor out = scaled_dot_product_attention(in.q, in.k, in.v, options(c, bias));
  EXPECT_TRUE(testing::rel_max_error_within(out, refs().tensor("clip.f32"), 1e-5));
}

// The softmax's exponential, 2^x (arguments <= 0; -inf for masked scores must give exactly 0), in both
// variants: as accurate as an exp of float32 (the probabilities' sum keeps them unrounded).
TEST(Attention, SoftmaxExp2IsAccurate) {
  std::vector<float> x;
  for (float v = -152.0f; v <= 0.0f; v += 0.0093f) x.push_back(v);
  for (float v = -0.5f; v <= 0.0f; v += 1.0f / 4096) x.push_back(v);
  x.push_back(1e-6f);  // a few ulp above 0: the scale's rounding
  x.push_back(0.0f);
  x.push_back(-0.0f);
  x.push_back(-__builtin_inff());
  x.push_back(__builtin_nanf(""));
  std::vector<void (*)(const float*, float*, int64_t)> variants{cpu_kernels::generic::attn_softmax_exp2};
  if (cpu_features().avx512) variants.push_back(cpu_kernels::avx512::attn_softmax_exp2);
  for (auto fn : variants) {
    std::vector<float> y(x.size());
    fn(x.data(), y.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const double ref = std::exp2(static_cast<double>(x[i]));
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(y[i]));
      } else if (ref < 1.2e-38) {
        EXPECT_LE(y[i], 1.2e-38f) << x[i];
        if (std::isinf(x[i])) {
          EXPECT_EQ(y[i], 0.0f);
        }
      } else {
        EXPECT_LE(std::abs(y[i] - ref) / ref, 3e-7) << "2^" << x[i] << " = " << y[i] << ", expected " << ref;
      }
    }
  }
}

TEST(Attention, EmptyShapes) {
  for (DType dtype : {float32, bfloat16}) {
    // No keys: softmax over nothing, torch gives zeros.
    const Tensor q = Tensor::full({1, 2, 3, 8}, 1.0, dtype);
    const Tensor none = Tensor::empty({1, 2, 0, 8}, dtype);
    const Tensor out = scaled_dot_product_attention(q, none, none);
    EXPECT_EQ(out.shape(), (Shape{1, 2, 3, 8}));
    EXPECT_TRUE(testing::all_close(out, Tensor::zeros({1, 2, 3, 8}, dtype), 0, 0));
    // No queries.
    const Tensor kv = Tensor::full({1, 2, 5, 8}, 1.0, dtype);
    EXPECT_EQ(scaled_dot_product_attention(Tensor::empty({1, 2, 0, 8}, dtype), kv, kv).shape(),
              (Shape{1, 2, 0, 8}));
  }
}

void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "expected kiln::Error containing '" << fragment << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("scaled_dot_product_attention"), std::string::npos) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
  }
}

TEST(Attention, BadArgumentsThrow) {
  const Tensor q = Tensor::zeros({1, 2, 3, 8}), k = Tensor::zeros({1, 2, 5, 8}),
               v = Tensor::zeros({1, 2, 5, 4});
  expect_error([&] { scaled_dot_product_attention(q.select(0, 0), k, v); }, "expected 4-d");
  expect_error([&] { scaled_dot_product_attention(q, Tensor::zeros({1, 2, 5, 7}), v); }, "[1, 2, 5, 7]");
  expect_error([&] { scaled_dot_product_attention(q, k, Tensor::zeros({1, 2, 6, 4})); }, "[1, 2, 6, 4]");
  expect_error([&] { scaled_dot_product_attention(q, Tensor::zeros({1, 3, 5, 8}), v); }, "[1, 3, 5, 8]");
  expect_error([&] { scaled_dot_product_attention(q, Tensor::zeros({2, 2, 5, 8}), v); }, "[2, 2, 5, 8]");
  expect_error([&] { scaled_dot_product_attention(q, k.to(bfloat16), v); }, "bfloat16");
  expect_error([&] { scaled_dot_product_attention(q.to(int64), k.to(int64), v.to(int64)); }, "int64");
  AttentionOptions bad_bias;
  bad_bias.bias = Tensor::zeros({3, 4});
  expect_error([&] { scaled_dot_product_attention(q, k, v, bad_bias); }, "[3, 4]");
  bad_bias.bias = Tensor::zeros({2, 1, 1, 1, 5});
  expect_error([&] { scaled_dot_product_attention(q, k, v, bad_bias); }, "not broadcastable");
  bad_bias.bias = Tensor::zeros({3, 5}, int32);
  expect_error([&] { scaled_dot_product_attention(q, k, v, bad_bias); }, "int32");
  AttentionOptions bad_scale;
  bad_scale.scale = std::nan("");
  expect_error([&] { scaled_dot_product_attention(q, k, v, bad_scale); }, "scale");
}

}  // namespace
}  // namespace kiln
