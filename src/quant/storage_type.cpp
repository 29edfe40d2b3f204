#include "kiln/quant/storage_type.h"

#include <iterator>
#include <string>
#include <vector>

#include "backends/cpu/isa_dispatch.h"
#include "kiln/core/error.h"

namespace kiln {
namespace cpu_kernels {
KILN_ISA_DECLARE(void, dequantize_row_f32, (quant::StorageType, const void*, float*, int64_t));
KILN_ISA_DECLARE(void, dequantize_row_bf16, (quant::StorageType, const void*, bf16_t*, int64_t));

namespace {
void dequantize_row_picked(quant::StorageType type, const void* src, float* dst, int64_t n) {
  KILN_ISA_CALL(dequantize_row_f32)(type, src, dst, n);
}
void dequantize_row_picked(quant::StorageType type, const void* src, bf16_t* dst, int64_t n) {
  KILN_ISA_CALL(dequantize_row_bf16)(type, src, dst, n);
}
}  // namespace
}  // namespace cpu_kernels

namespace quant {

std::optional<StorageTypeTraits> find_ggml_type(uint32_t id) {
  for (const auto& t : kStorageTypes)
    if (t.in_gguf && static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

std::optional<StorageType> kept_safetensors_type(std::string_view stored_dtype, size_t rank) {
  if (rank != 2) return std::nullopt;
  for (const auto& t : kStorageTypes)
    if (is_fp8(t.type) && stored_dtype == t.name) return t.type;
  return std::nullopt;
}

const StorageTypeTraits& traits(StorageType type) {
  for (const auto& t : kStorageTypes)
    if (t.type == type) return t;
  KILN_FAIL("internal: ggml type id " << static_cast<uint32_t>(type) << " has no traits");
}

std::string_view type_name(StorageType type) {
  return traits(type).name;
}

const char* supported_type_names() {
  static const std::string names = [] {
    std::vector<std::string> gguf;
    for (const auto& t : kStorageTypes)
      if (t.in_gguf) gguf.emplace_back(t.name);
    std::string s;
    for (size_t i = 0; i < gguf.size(); ++i)
      s += (i == 0 ? "" : i + 1 == gguf.size() ? " or " : ", ") + gguf[i];
    return s;
  }();
  return names.c_str();
}

int64_t row_bytes(StorageType type, int64_t elements) {
  const StorageTypeTraits& t = traits(type);
  KILN_CHECK(elements >= 0 && elements % t.block_size == 0, t.name << ": a row of " << elements
                                                                   << " elements is not a whole number of "
                                                                   << t.block_size << "-element blocks");
  int64_t bytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(elements / t.block_size, static_cast<int64_t>(t.type_size), &bytes),
             t.name << ": a row of " << elements << " elements is too large");
  return bytes;
}

DType plain_dtype(StorageType type) {
  switch (type) {
    case StorageType::F32:
      return float32;
    case StorageType::F16:
      return float16;
    case StorageType::BF16:
      return bfloat16;
    default:
      break;
  }
  KILN_FAIL("internal: " << type_name(type) << " is block-quantized and has no plain dtype");
}

void dequantize_row(StorageType type, const void* src, float* dst, int64_t n) {
  row_bytes(type, n);  // validates n
  cpu_kernels::dequantize_row_picked(type, src, dst, n);
}

void dequantize_row(StorageType type, const void* src, bf16_t* dst, int64_t n) {
  row_bytes(type, n);
  cpu_kernels::dequantize_row_picked(type, src, dst, n);
}

}  // namespace quant
}  // namespace kiln
