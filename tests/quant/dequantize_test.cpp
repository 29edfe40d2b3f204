// Dequantization of every supported GGUF storage type against the gguf package's own values
// (tools/gguf_refs/make_quant_refs.py): bit for bit, in both kernel builds (AVX-512 and portable).
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/isa_dispatch.h"
#include "kiln/io/gguf.h"
#include "kiln/io/safetensors.h"
#include "kiln/quant/ggml_type.h"
#include "support/test_data.h"

namespace kiln::cpu_kernels {
KILN_ISA_DECLARE(void, dequantize_row_f32, (quant::GgmlType, const void*, float*, int64_t));
KILN_ISA_DECLARE(void, dequantize_row_bf16, (quant::GgmlType, const void*, bf16_t*, int64_t));
}  // namespace kiln::cpu_kernels

namespace kiln {
namespace {

using quant::GgmlType;

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

using RowFn = void (*)(GgmlType, const void*, float*, int64_t);
using RowBf16Fn = void (*)(GgmlType, const void*, bf16_t*, int64_t);

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

// A type added to the table (which the kernels take their block sizes from) needs reference values here.
TEST(GgmlTypeTraits, EveryTypeOfTheTableHasReferences) {
  std::set<std::string> table, covered;
  for (const quant::GgmlTypeTraits& t : quant::kGgmlTypes) table.insert(t.name);
  for (const auto& name : refs().file.names())
    covered.insert(std::string(quant::type_name(refs().file.info(name).type)));
  EXPECT_EQ(covered, table);
  EXPECT_STREQ(quant::supported_type_names(),
               "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K");
}

TEST(GgmlTypeTraits, BlockSizesAndRowBytes) {
  EXPECT_EQ(quant::row_bytes(GgmlType::Q8_0, 3072), 3072 / 32 * 34);
  EXPECT_EQ(quant::row_bytes(GgmlType::Q4_K, 3072), 3072 / 256 * 144);
  EXPECT_EQ(quant::row_bytes(GgmlType::BF16, 7), 14);
  EXPECT_EQ(quant::traits(GgmlType::Q6_K).type_size, 210);
  EXPECT_TRUE(quant::traits(GgmlType::Q2_K).is_quantized);
  EXPECT_FALSE(quant::traits(GgmlType::F16).is_quantized);
  EXPECT_FALSE(quant::find_ggml_type(9).has_value());  // Q8_1: not a storage format diffusers uses
  try {
    quant::row_bytes(GgmlType::Q4_K, 300);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a whole number of 256-element blocks"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
