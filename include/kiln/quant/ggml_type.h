// Storage types of GGUF tensors (ggml's type ids) as type traits: how many elements a block holds, how many
// bytes it takes, whether it is block-quantized, and how a row of blocks becomes floats. For block formats
// `bytes = numel * element_size` does not hold; a row of K elements takes K / block_size * type_size bytes.
//
// The quantized types are the ones diffusers' GGUF support loads and people publish FLUX/SD3.5 files in:
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-element blocks) and the K-quants Q2_K..Q6_K (256-element super-blocks).
// Dequantization reproduces the `gguf` Python package (gguf.quants.dequantize) bit for bit: the same float32
// operations in the same order, never fused into FMAs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/core/dtype.h"

namespace kiln::quant {

// Values are ggml's type ids as written in GGUF tensor infos.
enum class GgmlType : uint32_t {
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
};

struct GgmlTypeTraits {
  GgmlType type;
  const char* name;    // "Q8_0", as ggml and the gguf package name it
  int64_t block_size;  // elements per block (1 for plain floats)
  int64_t type_size;   // bytes per block
  bool is_quantized;   // block-quantized (false for F32, F16, BF16)
};

// Every supported type, with block sizes and bytes per block as in ggml's type_traits (ggml.c) and gguf's
// GGML_QUANT_SIZES. The kernels read their block sizes from here (through traits()), and check at compile
// time that each block-quantized type has a dequantize kernel.
inline constexpr GgmlTypeTraits kGgmlTypes[] = {
    {GgmlType::F32, "F32", 1, 4, false},      {GgmlType::F16, "F16", 1, 2, false},
    {GgmlType::BF16, "BF16", 1, 2, false},    {GgmlType::Q4_0, "Q4_0", 32, 18, true},
    {GgmlType::Q4_1, "Q4_1", 32, 20, true},   {GgmlType::Q5_0, "Q5_0", 32, 22, true},
    {GgmlType::Q5_1, "Q5_1", 32, 24, true},   {GgmlType::Q8_0, "Q8_0", 32, 34, true},
    {GgmlType::Q2_K, "Q2_K", 256, 84, true},  {GgmlType::Q3_K, "Q3_K", 256, 110, true},
    {GgmlType::Q4_K, "Q4_K", 256, 144, true}, {GgmlType::Q5_K, "Q5_K", 256, 176, true},
    {GgmlType::Q6_K, "Q6_K", 256, 210, true},
};

// The traits of a type id read from a file; nullopt for ids Kiln does not support (Q8_1, IQ*, TQ*, ...).
std::optional<GgmlTypeTraits> find_ggml_type(uint32_t id);
const GgmlTypeTraits& traits(GgmlType type);
std::string_view type_name(GgmlType type);
// "F32, F16, BF16, Q4_0, ..." for error messages.
const char* supported_type_names();

// Bytes one row of `elements` takes; throws kiln::Error when `elements` is not a multiple of the block size.
int64_t row_bytes(GgmlType type, int64_t elements);

// The plain dtype a non-quantized type stores (F32 -> float32, F16 -> float16, BF16 -> bfloat16).
DType plain_dtype(GgmlType type);

// Dequantizes `n` elements (a multiple of the block size) stored at `src` in `type` into `dst`.
// The float32 values equal gguf.quants.dequantize bit for bit; the bfloat16 variant rounds those values to
// nearest even. Uses the AVX-512 build of the kernels where the CPU has it (KILN_CPU_ISA=generic forces the
// portable one; both give the same bits).
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);
void dequantize_row(GgmlType type, const void* src, bf16_t* dst, int64_t n);

}  // namespace kiln::quant
