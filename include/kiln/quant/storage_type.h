// The formats a weight can stay stored in while Linear layers compute on it, as type traits: how many
// elements a block holds, how many bytes it takes, whether only linear_quantized reads it, and how a row of
// blocks becomes floats. For block formats `bytes = numel * element_size` does not hold; a row of K elements
// takes K / block_size * type_size bytes.
//
// GGUF's types (ggml's type ids): the quantized ones are those diffusers' GGUF support loads and people
// publish FLUX/SD3.5 files in: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-element blocks) and the K-quants Q2_K..Q6_K
// (256-element super-blocks). Dequantization reproduces the `gguf` Python package (gguf.quants.dequantize)
// bit for bit: the same float32 operations in the same order, never fused into FMAs. Safetensors' 8-bit
// floats (torch.float8_e4m3fn and float8_e5m2, "F8_E4M3" and "F8_E5M2" in the file), as FLUX and SD3.5
// checkpoints are published in: one byte per element, every value exactly a bfloat16, so a weight kept in fp8
// computes exactly as the bfloat16 weight a widening load gives (what diffusers computes with such a file at
// torch_dtype=bfloat16).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/core/dtype.h"

namespace kiln::quant {

// GGUF's types have ggml's type ids as written in GGUF tensor infos; the fp8 types ids of their own, which no
// GGUF holds (find_ggml_type does not return them).
enum class StorageType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
  F8_E4M3 = 1000,
  F8_E5M2 = 1001,
};

struct StorageTypeTraits {
  StorageType type;
  const char* name;    // "Q8_0", as ggml and the gguf package name it; "F8_E4M3", as safetensors does
  int64_t block_size;  // elements per block (1 for plain floats and fp8)
  int64_t type_size;   // bytes per block
  bool is_quantized;   // only linear_quantized reads it: block-quantized, or fp8 (false for F32, F16, BF16)
  bool in_gguf;        // a GGUF tensor type
};

// Every supported type, GGUF's with block sizes and bytes per block as in ggml's type_traits (ggml.c) and
// gguf's GGML_QUANT_SIZES. The kernels read their block sizes from here (through traits()), and check at
// compile time that each quantized type has a dequantize kernel.
inline constexpr StorageTypeTraits kStorageTypes[] = {
    {StorageType::F32, "F32", 1, 4, false, true},
    {StorageType::F16, "F16", 1, 2, false, true},
    {StorageType::BF16, "BF16", 1, 2, false, true},
    {StorageType::Q4_0, "Q4_0", 32, 18, true, true},
    {StorageType::Q4_1, "Q4_1", 32, 20, true, true},
    {StorageType::Q5_0, "Q5_0", 32, 22, true, true},
    {StorageType::Q5_1, "Q5_1", 32, 24, true, true},
    {StorageType::Q8_0, "Q8_0", 32, 34, true, true},
    {StorageType::Q2_K, "Q2_K", 256, 84, true, true},
    {StorageType::Q3_K, "Q3_K", 256, 110, true, true},
    {StorageType::Q4_K, "Q4_K", 256, 144, true, true},
    {StorageType::Q5_K, "Q5_K", 256, 176, true, true},
    {StorageType::Q6_K, "Q6_K", 256, 210, true, true},
    {StorageType::F8_E4M3, "F8_E4M3", 1, 1, true, false},
    {StorageType::F8_E5M2, "F8_E5M2", 1, 1, true, false},
};

// Safetensors' 8-bit floats, the types not from GGUF.
constexpr bool is_fp8(StorageType type) {
  return type == StorageType::F8_E4M3 || type == StorageType::F8_E5M2;
}

// The storage type a safetensors tensor keeps in memory when a Linear layer loads it: an fp8 matrix (stored
// dtype "F8_E4M3" or "F8_E5M2", `rank` 2) stays fp8; nullopt for every other tensor, which the reader gives
// in its own dtype or widened.
std::optional<StorageType> kept_safetensors_type(std::string_view stored_dtype, size_t rank);

// The traits of a GGUF tensor type id read from a file; nullopt for ids Kiln does not support (Q8_1, IQ*,
// TQ*, ...) and for the fp8 types' ids.
std::optional<StorageTypeTraits> find_ggml_type(uint32_t id);
const StorageTypeTraits& traits(StorageType type);
std::string_view type_name(StorageType type);
// "F32, F16, BF16, Q4_0, ..." (GGUF's types) for error messages.
const char* supported_type_names();

// Bytes one row of `elements` takes; throws kiln::Error when `elements` is not a multiple of the block size.
int64_t row_bytes(StorageType type, int64_t elements);

// The plain dtype a non-quantized type stores (F32 -> float32, F16 -> float16, BF16 -> bfloat16).
DType plain_dtype(StorageType type);

// Dequantizes `n` elements (a multiple of the block size) stored at `src` in `type` into `dst`.
// The float32 values equal gguf.quants.dequantize bit for bit (fp8: torch's conversion, exact); the bfloat16
// variant rounds those values to nearest even (exact for fp8). Uses the AVX-512 build of the kernels where
// the CPU has it (KILN_CPU_ISA=generic forces the portable one; both give the same bits).
void dequantize_row(StorageType type, const void* src, float* dst, int64_t n);
void dequantize_row(StorageType type, const void* src, bf16_t* dst, int64_t n);

}  // namespace kiln::quant
