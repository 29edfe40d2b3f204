#include "kiln/quant/ggml_type.h"

#include <iterator>
#include <string>

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

std::optional<GgmlTypeTraits> find_ggml_type(uint32_t id) {
  for (const auto& t : kGgmlTypes)
    if (static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

const GgmlTypeTraits& traits(GgmlType type) {
  for (const auto& t : kGgmlTypes)
    if (t.type == type) return t;
  KILN_FAIL("internal: ggml type id " << static_cast<uint32_t>(type) << " has no traits");
}

std::string_view type_name(GgmlType type) {
  return traits(type).name;
}

const char* supported_type_names() {
  static const std::string names = [] {
    std::string s;
    const size_t n = std::size(kGgmlTypes);
    for (size_t i = 0; i < n; ++i)
      s += (i == 0 ? "" : i + 1 == n ? " or " : ", ") + std::string(kGgmlTypes[i].name);
    return s;
  }();
  return names.c_str();
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
