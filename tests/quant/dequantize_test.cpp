// Dequantization of every supported GGUF storage type against the gguf package's own values
// (tools/gguf_refs/make_quant_refs.py), and of every fp8 byte against torch's conversion
// (tools/io_refs/make_safetensors_fixtures.py): bit for bit, in both kernel builds (AVX-512 and portable).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/isa_dispatch.h"
#include "kiln/io/gguf.h"
#include "kiln/io/safetensors.h"
#include "kiln/quant/storage_type.h"
#include "support/test_data.h"

namespace kiln::cpu_kernels {
KILN_ISA_DECLARE(void, dequantize_row_f32, (quant::StorageType, const void*, float*, int64_t));
KILN_ISA_DECLARE(void, dequantize_row_bf16, (quant::StorageType, const void*, bf16_t*, int64_t));
}  // namespace kiln::cpu_kernels

namespace kiln {
namespace {

using quant::StorageType;

struct Refs {
  io::GgufFile file{testing::data_path("gguf/quant_types.gguf")};
  io::SafetensorsFile expected{testing::data_path("gguf/quant_types_expected.safetensors")};
};

const Refs& refs() {
  static const Refs r;
  return r;
}

// The first index where the bits differ, or -1.
int64_t first_bit_difference(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return i;
  return -1;
}

using RowFn = void (*)(StorageType, const void*, float*, int64_t);
using RowBf16Fn = void (*)(StorageType, const void*, bf16_t*, int64_t);

// Dequantizes every row of `name` with `fn` and compares the bits with gguf's values.
void expect_kernel_matches(const std::string& name, RowFn fn, RowBf16Fn fn_bf16, const char* isa) {
  const quant::QuantizedTensor q = refs().file.blocks(name);
  const Tensor expected = refs().expected.tensor(name).contiguous();
  const float* want = expected.data<float>();
  const int64_t k = q.shape.back(), rows = q.blocks.size(0);
  std::vector<float> got(static_cast<size_t>(k));
  std::vector<bf16_t> got_bf16(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = q.blocks.data<uint8_t>() + r * q.blocks.size(1);
    fn(q.type, src, got.data(), k);
    const int64_t at = first_bit_difference(got.data(), want + r * k, k);
    EXPECT_EQ(at, -1) << name << " (" << isa << "), row " << r << ", element " << at << ": got "
                      << got[static_cast<size_t>(std::max<int64_t>(at, 0))] << ", gguf has "
                      << want[r * k + std::max<int64_t>(at, 0)];
    fn_bf16(q.type, src, got_bf16.data(), k);
    for (int64_t i = 0; i < k; ++i)
      ASSERT_EQ(got_bf16[static_cast<size_t>(i)].bits, f32_to_bf16(want[r * k + i]).bits)
          << name << " (" << isa << ") bfloat16, row " << r << ", element " << i;
  }
}

TEST(Dequantize, EveryTypeMatchesTheGgufPackageBitForBit) {
  std::set<std::string> types;
  for (const auto& name : refs().file.names()) {
    const Tensor got = refs().file.tensor(name).to(float32).contiguous();
    const Tensor want = refs().expected.tensor(name).contiguous();
    ASSERT_EQ(got.shape(), want.shape()) << name;
    EXPECT_EQ(first_bit_difference(got.data<float>(), want.data<float>(), got.numel()), -1) << name;
    types.insert(std::string(quant::type_name(refs().file.info(name).type)));
  }
  // Every supported type is covered by the committed references.
  EXPECT_EQ(types.size(), 13u);
}

TEST(Dequantize, PortableKernelsMatchTheGgufPackage) {
  for (const auto& name : refs().file.names())
    expect_kernel_matches(name, cpu_kernels::generic::dequantize_row_f32,
                          cpu_kernels::generic::dequantize_row_bf16, "generic");
}

TEST(Dequantize, Avx512KernelsMatchTheGgufPackage) {
  if (!cpu_kernels::cpu_features().avx512) GTEST_SKIP() << "this CPU has no AVX-512";
  for (const auto& name : refs().file.names())
    expect_kernel_matches(name, cpu_kernels::avx512::dequantize_row_f32,
                          cpu_kernels::avx512::dequantize_row_bf16, "avx512");
}

const std::pair<const char*, StorageType> kFp8Cases[] = {{"f8_e4m3", StorageType::F8_E4M3},
                                                         {"f8_e5m2", StorageType::F8_E5M2}};

// Every byte of F8_E4M3 and F8_E5M2 (the io fixture's 16 x 16 tables, read as their stored bytes) widens to
// torch's value of it, in float32 and bfloat16 (exact: every fp8 value is a bfloat16), NaNs to NaNs.
void expect_fp8_matches_torch(RowFn fn, RowBf16Fn fn_bf16, const char* isa) {
  const io::SafetensorsFile dtypes(testing::data_path("io/dtypes.safetensors"));
  const io::SafetensorsFile expected(testing::data_path("io/expected.safetensors"));
  for (const auto& [name, type] : kFp8Cases) {
    const Tensor bytes = dtypes.stored_bytes(name).contiguous();
    ASSERT_EQ(bytes.shape(), (Shape{16, 16}));
    const std::vector<double> want = expected.tensor(name).to_vector<double>();
    // One row of 256 (the vector loop) and 16 rows of 16, and a row of 13 (the partial tail).
    std::vector<float> got(256);
    std::vector<bf16_t> got_bf16(256);
    fn(type, bytes.raw_data(), got.data(), 256);
    fn_bf16(type, bytes.raw_data(), got_bf16.data(), 256);
    std::vector<float> tail(13);
    fn(type, static_cast<const uint8_t*>(bytes.raw_data()) + 100, tail.data(), 13);
    for (size_t i = 0; i < 256; ++i) {
      SCOPED_TRACE(std::string(name) + " (" + isa + "), byte " + std::to_string(i));
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i]));
        EXPECT_TRUE(std::isnan(bf16_to_f32(got_bf16[i])));
        continue;
      }
      EXPECT_EQ(static_cast<double>(got[i]), want[i]);
      EXPECT_EQ(static_cast<double>(bf16_to_f32(got_bf16[i])), want[i]);
      EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i]));  // -0 stays -0
      if (i >= 100 && i < 113) {
        EXPECT_EQ(tail[i - 100], got[i]);
      }
    }
  }
}

TEST(Dequantize, Fp8MatchesTorch) {
  for (const auto& [name, type] : kFp8Cases) {
    const io::SafetensorsFile dtypes(testing::data_path("io/dtypes.safetensors"));
    const Tensor bytes = dtypes.stored_bytes(name);
    const Tensor want = dtypes.tensor(name).to(float32);  // the reader's own widening, checked against torch
    std::vector<float> got(256);
    quant::dequantize_row(type, bytes.raw_data(), got.data(), 256);
    const std::vector<float> w = want.to_vector<float>();
    for (size_t i = 0; i < 256; ++i)
      EXPECT_TRUE(got[i] == w[i] || (std::isnan(got[i]) && std::isnan(w[i]))) << name << " byte " << i;
  }
}

TEST(Dequantize, Fp8PortableKernelsMatchTorch) {
  expect_fp8_matches_torch(cpu_kernels::generic::dequantize_row_f32,
                           cpu_kernels::generic::dequantize_row_bf16, "generic");
}

TEST(Dequantize, Fp8Avx512KernelsMatchTorch) {
  if (!cpu_kernels::cpu_features().avx512) GTEST_SKIP() << "this CPU has no AVX-512";
  expect_fp8_matches_torch(cpu_kernels::avx512::dequantize_row_f32, cpu_kernels::avx512::dequantize_row_bf16,
                           "avx512");
}

// A GGUF type added to the table (which the kernels take their block sizes from) needs reference values here;
// the fp8 types have theirs above.
TEST(StorageTypeTraits, EveryTypeOfTheTableHasReferences) {
  std::set<std::string> table, covered;
  for (const quant::StorageTypeTraits& t : quant::kStorageTypes) {
    if (t.in_gguf)
      table.insert(t.name);
    else
      EXPECT_TRUE(t.type == StorageType::F8_E4M3 || t.type == StorageType::F8_E5M2) << t.name;
  }
  for (const auto& name : refs().file.names())
    covered.insert(std::string(quant::type_name(refs().file.info(name).type)));
  EXPECT_EQ(covered, table);
  EXPECT_STREQ(quant::supported_type_names(),
               "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K");
}

TEST(StorageTypeTraits, BlockSizesAndRowBytes) {
  EXPECT_EQ(quant::row_bytes(StorageType::Q8_0, 3072), 3072 / 32 * 34);
  EXPECT_EQ(quant::row_bytes(StorageType::Q4_K, 3072), 3072 / 256 * 144);
  EXPECT_EQ(quant::row_bytes(StorageType::BF16, 7), 14);
  EXPECT_EQ(quant::traits(StorageType::Q6_K).type_size, 210);
  EXPECT_TRUE(quant::traits(StorageType::Q2_K).is_quantized);
  EXPECT_FALSE(quant::traits(StorageType::F16).is_quantized);
  EXPECT_FALSE(quant::find_ggml_type(9).has_value());  // Q8_1: not a storage format diffusers uses
  // fp8: one byte per element, kept as it is stored; no GGUF type id names it.
  EXPECT_EQ(quant::row_bytes(StorageType::F8_E4M3, 7), 7);
  EXPECT_TRUE(quant::traits(StorageType::F8_E5M2).is_quantized);
  EXPECT_FALSE(quant::find_ggml_type(static_cast<uint32_t>(StorageType::F8_E4M3)).has_value());
  try {
    quant::row_bytes(StorageType::Q4_K, 300);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a whole number of 256-element blocks"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
