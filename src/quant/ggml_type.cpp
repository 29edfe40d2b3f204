#include "kiln/quant/ggml_type.h"

#include "backends/cpu/isa_dispatch.h"
#include "kiln/core/error.h"

namespace kiln {
namespace cpu_kernels {
KILN_ISA_DECLARE(void, dequantize_row_f32, (quant::GgmlType, const void*, float*, int64_t));
KILN_ISA_DECLARE(void, dequantize_row_bf16, (quant::GgmlType, const void*, bf16_t*, int64_t));

namespace {
void dequantize_row_picked(quant::GgmlType type, const void* src, float* dst, int64_t n) {
  KILN_ISA_CALL(dequantize_row_f32)(type, src, dst, n);
}
void dequantize_row_picked(quant::GgmlType type, const void* src, bf16_t* dst, int64_t n) {
  KILN_ISA_CALL(dequantize_row_bf16)(type, src, dst, n);
}
}  // namespace
}  // namespace cpu_kernels

namespace quant {

namespace {

// Block sizes and bytes per block as in ggml's type_traits (ggml.c) and gguf's GGML_QUANT_SIZES.
constexpr GgmlTypeTraits kTypes[] = {
    {GgmlType::F32, "F32", 1, 4, false},      {GgmlType::F16, "F16", 1, 2, false},
    {GgmlType::BF16, "BF16", 1, 2, false},    {GgmlType::Q4_0, "Q4_0", 32, 18, true},
    {GgmlType::Q4_1, "Q4_1", 32, 20, true},   {GgmlType::Q5_0, "Q5_0", 32, 22, true},
    {GgmlType::Q5_1, "Q5_1", 32, 24, true},   {GgmlType::Q8_0, "Q8_0", 32, 34, true},
    {GgmlType::Q2_K, "Q2_K", 256, 84, true},  {GgmlType::Q3_K, "Q3_K", 256, 110, true},
    {GgmlType::Q4_K, "Q4_K", 256, 144, true}, {GgmlType::Q5_K, "Q5_K", 256, 176, true},
    {GgmlType::Q6_K, "Q6_K", 256, 210, true},
};

}  // namespace

std::optional<GgmlTypeTraits> find_ggml_type(uint32_t id) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

const GgmlTypeTraits& traits(GgmlType type) {
  for (const auto& t : kTypes)
    if (t.type == type) return t;
  KILN_FAIL("internal: ggml type id " << static_cast<uint32_t>(type) << " has no traits");
}

std::string_view type_name(GgmlType type) {
  return traits(type).name;
}

const char* supported_type_names() {
  return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K";
}

int64_t row_bytes(GgmlType type, int64_t elements) {
  const GgmlTypeTraits& t = traits(type);
  KILN_CHECK(elements >= 0 && elements % t.block_size == 0, t.name << ": a row of " << elements
                                                                   << " elements is not a whole number of "
                                                                   << t.block_size << "-element blocks");
  int64_t bytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(elements / t.block_size, static_cast<int64_t>(t.type_size), &bytes),
             t.name << ": a row of " << elements << " elements is too large");
  return bytes;
}

DType plain_dtype(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
      return float32;
    case GgmlType::F16:
      return float16;
    case GgmlType::BF16:
      return bfloat16;
    default:
      break;
  }
  KILN_FAIL("internal: " << type_name(type) << " is block-quantized and has no plain dtype");
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  row_bytes(type, n);  // validates n
  cpu_kernels::dequantize_row_picked(type, src, dst, n);
}

void dequantize_row(GgmlType type, const void* src, bf16_t* dst, int64_t n) {
  row_bytes(type, n);
  cpu_kernels::dequantize_row_picked(type, src, dst, n);
}

}  // namespace quant
}  // namespace kiln
