// linear with a block-quantized weight (GGUF): against a float64 product of the dequantized weight, across
// several panels of output rows, with and without bias, in float32 and bfloat16; bf16 products on the host's
// bf16 path (own_gemm_test.cpp reruns these tests on every path the host can run); and nn::Linear loaded from
// a GGUF file keeps its weight quantized and computes the same.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backends/cpu/matmul_path.h"
#include "kiln/core/half.h"
#include "kiln/io/gguf.h"
#include "kiln/nn/gguf_weights.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/quantized_linear.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using quant::StorageType;

// Random blocks of `type` for a [n, k] weight: random packed bits, float16 scales drawn around `scale`.
quant::QuantizedTensor random_blocks(StorageType type, int64_t n, int64_t k, uint32_t seed) {
  const int64_t rb = quant::row_bytes(type, k);
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(static_cast<size_t>(n * rb));
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  const auto& t = quant::traits(type);
  // Overwrite the float16 fields with finite scales (offsets as in the ggml block structs).
  std::vector<int> halves;
  switch (type) {
    case StorageType::Q8_0:
    case StorageType::Q4_0:
      halves = {0};
      break;
    case StorageType::Q4_K:
    case StorageType::Q5_K:
      halves = {0, 2};
      break;
    case StorageType::Q6_K:
      halves = {208};
      break;
    default:
      ADD_FAILURE() << "no scale layout for " << t.name;
  }
  std::normal_distribution<float> dist(0.0f, 0.01f);
  for (int64_t b = 0; b < n * rb / t.type_size; ++b)
    for (int off : halves) {
      const f16_t h = f32_to_f16(dist(rng));
      std::memcpy(&bytes[static_cast<size_t>(b * t.type_size + off)], &h, 2);
    }
  return {Tensor::from_vector(bytes, {n, rb}), type, {n, k}};
}

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape);
}

// y[m, n] = sum_k x[m, k] w[n, k] (+ bias) in float64 from float32 operands.
std::vector<double> reference(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const auto xv = x.to_vector<float>(), wv = w.to_vector<float>();
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  const std::vector<float> b = bias.defined() ? bias.to(float32).to_vector<float>() : std::vector<float>();
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = b.empty() ? 0.0 : b[static_cast<size_t>(j)];
      for (int64_t p = 0; p < k; ++p)
        s += static_cast<double>(xv[static_cast<size_t>(i * k + p)]) * wv[static_cast<size_t>(j * k + p)];
      y[static_cast<size_t>(i * n + j)] = s;
    }
  return y;
}

// max |got - want| / max |want|.
double relative_error(const Tensor& got, const std::vector<double>& want) {
  const auto g = got.to_vector<float>();
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(g[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

struct Case {
  StorageType type;
  int64_t m, n, k;
};

TEST(QuantizedLinear, MatchesAFloat64ProductOfTheDequantizedWeight) {
  // m <= 4 takes the matrix-vector kernel, larger m the GEMM on expanded panels; n = 4500 and 2100 span
  // several panels of output rows (at most 2048 each), the last one partial.
  for (const Case c : {Case{StorageType::Q8_0, 5, 4500, 96}, Case{StorageType::Q8_0, 1, 300, 96},
                       Case{StorageType::Q4_0, 3, 40, 64}, Case{StorageType::Q4_K, 7, 600, 512},
                       Case{StorageType::Q6_K, 9, 2100, 256}, Case{StorageType::Q6_K, 1, 530, 256},
                       Case{StorageType::Q5_K, 2, 17, 256}}) {
    SCOPED_TRACE(std::string(quant::type_name(c.type)) + " n=" + std::to_string(c.n));
    const quant::QuantizedTensor w = random_blocks(c.type, c.n, c.k, 7);
    const Tensor wf = w.dequantize();
    const Tensor x = random_tensor({c.m, c.k}, 3);
    const Tensor bias = random_tensor({c.n}, 5);
    // float32: the exact dequantized values, float32 accumulation.
    EXPECT_LT(relative_error(linear(x, w), reference(x, wf, {})), 2e-6);
    EXPECT_LT(relative_error(linear(x, w, bias), reference(x, wf, bias)), 2e-6);
    // bfloat16: the weight rounded to bfloat16 as diffusers' GGUFLinear does; one rounding of the output.
    const Tensor xb = x.to(bfloat16);
    const Tensor yb = linear(xb, w, bias.to(bfloat16));
    EXPECT_EQ(yb.dtype(), bfloat16);
    EXPECT_LT(relative_error(yb.to(float32),
                             reference(xb.to(float32), wf.to(bfloat16).to(float32), bias.to(bfloat16))),
              8e-3);
  }
}

// A bf16 product with a quantized weight multiplies each expanded panel on the bf16 path this process takes
// (matmul_path.h), as the dense bf16 weight would be: on Kiln's own GEMMs (fma32, amx), whose sums do not
// depend on how the output columns are split, the bits equal the dense weight's product, so a panel that went
// to oneDNN's vdpbf16ps instead would show; on oneDNN, within the product's bf16 rounding.
TEST(QuantizedLinear, Bf16ProductRunsOnTheHostsBf16Path) {
  // 64 rows: past kFma32MinRows and kAmxMinRows, so the automatic paths take it too; n = 2100 spans two
  // panels (of 1536 rows on Kiln's own GEMMs, 2048 on oneDNN), the second partial.
  const quant::QuantizedTensor w = random_blocks(StorageType::Q8_0, 2100, 256, 11);
  const Tensor xb = random_tensor({64, 256}, 12).to(bfloat16);
  const Tensor bias = random_tensor({2100}, 13).to(bfloat16);
  const Tensor dense_w = w.dequantize().to(bfloat16);
  const Tensor got = linear(xb, w, bias).to(float32);
  const Tensor want = linear(xb, dense_w, bias).to(float32);
  const cpu_kernels::Bf16Path path = cpu_kernels::bf16_path();
  SCOPED_TRACE(std::string("bf16 path ") + cpu_kernels::bf16_path_name(path));
  if (path == cpu_kernels::Bf16Path::Onednn)
    EXPECT_TRUE(testing::rel_max_error_within(got, want, 8e-3));
  else
    EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>());
}

// fp8 weights (safetensors' F8_E4M3 and F8_E5M2 kept as stored): the product of their exact values, on the
// matrix-vector kernel (1 row) and the panel GEMM (70 rows, two panels of output columns), f32 and bf16.
TEST(QuantizedLinear, Fp8WeightsMultiplyAsTheirExactValues) {
  for (const StorageType type : {StorageType::F8_E4M3, StorageType::F8_E5M2}) {
    SCOPED_TRACE(std::string(quant::type_name(type)));
    const int64_t n = 2100, k = 80;
    std::mt19937 rng(21);
    std::vector<uint8_t> bytes(static_cast<size_t>(n * k));
    // Exponent's top bit cleared: magnitudes up to 1.875, no NaN or infinity patterns.
    for (auto& b : bytes) b = static_cast<uint8_t>(rng()) & 0xbf;
    const quant::QuantizedTensor w{Tensor::from_vector(bytes, {n, k}), type, {n, k}};
    const Tensor wf = w.dequantize();
    EXPECT_EQ(wf.to(bfloat16).to(float32).to_vector<float>(), wf.to_vector<float>());  // exactly bf16 values
    const Tensor bias = random_tensor({n}, 22);
    for (const int64_t m : {1, 70}) {
      const Tensor x = random_tensor({m, k}, 23);
      EXPECT_LT(relative_error(linear(x, w, bias), reference(x, wf, bias)), 2e-6) << m << " rows";
      const Tensor xb = x.to(bfloat16);
      const Tensor yb = linear(xb, w, bias.to(bfloat16));
      EXPECT_LT(relative_error(yb.to(float32), reference(xb.to(float32), wf, bias.to(bfloat16))), 8e-3)
          << m << " rows";
    }
  }
}

TEST(QuantizedLinear, LeadingDimsAndErrors) {
  const quant::QuantizedTensor w = random_blocks(StorageType::Q8_0, 6, 64, 1);
  const Tensor x = random_tensor({2, 3, 64}, 2);
  const Tensor y = linear(x, w);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 6}));
  EXPECT_LT(relative_error(y.reshape({6, 6}), reference(x.reshape({6, 64}), w.dequantize(), {})), 2e-6);
  try {
    linear(random_tensor({2, 32}, 1), w);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in_features"), std::string::npos) << e.what();
  }
}

// A GGUF written by the gguf package, loaded into nn::Linear: the weight stays as its Q8_0 blocks.
class TinyLinear : public nn::Module {
 public:
  TinyLinear() : proj(96, 7, false) { register_module("proj", &proj); }
  nn::Linear proj;
};

TEST(QuantizedLinear, LinearLoadedFromGgufStaysQuantized) {
  const std::string path = testing::data_path("gguf/quant_types.gguf");
  const nn::GgufWeights gguf(path);
  // Only t7.Q8_0 [7, 96] is used; the file's other tensors are ignored by prefix.
  struct Only : nn::WeightSource {
    const nn::GgufWeights& inner;
    explicit Only(const nn::GgufWeights& w) : inner(w) {}
    bool contains(const std::string& n) const override { return n == "proj.weight"; }
    Shape shape(const std::string&) const override { return inner.shape("t7.Q8_0"); }
    Tensor load(const std::string&) const override { return inner.load("t7.Q8_0"); }
    quant::QuantizedTensor load_quantized(const std::string&) const override {
      return inner.load_quantized("t7.Q8_0");
    }
    std::vector<std::string> names() const override { return {"proj.weight"}; }
    std::string description() const override { return inner.description(); }
  } source(gguf);
  TinyLinear model;
  model.load_weights(source, {.dtype = bfloat16});
  EXPECT_TRUE(model.proj.is_quantized());
  EXPECT_EQ(model.proj.weight.dtype(), uint8);
  EXPECT_EQ(model.proj.weight.nbytes(), 7u * 3u * 34u);
  EXPECT_EQ(model.proj.dtype(), bfloat16);
  EXPECT_TRUE(model.proj.weight.storage()->is_file_pages());  // still the file's pages
  const Tensor x = random_tensor({4, 96}, 9).to(bfloat16);
  const Tensor want = linear(x, gguf.load("t7.Q8_0").to(bfloat16));
  EXPECT_TRUE(testing::rel_max_error_within(model.proj(x).to(float32), want.to(float32), 1e-2));

  TinyLinear plain;
  plain.load_weights(source, {.dtype = float32, .keep_quantized = false});
  EXPECT_FALSE(plain.proj.is_quantized());
  EXPECT_EQ(plain.proj.weight.dtype(), float32);
}

}  // namespace
}  // namespace kiln
