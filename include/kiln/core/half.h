// 16-bit floating point storage types and their exact conversions (round to nearest, ties to even).
// Kernels convert whole vectors elsewhere; these scalar versions define the reference behaviour.
#pragma once

#include <bit>
#include <cstdint>

namespace kiln {

struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline float bf16_to_f32(bf16_t v) {
  return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16);
}

inline bf16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

inline float f16_to_f32(f16_t v) {
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  const uint32_t exp = (v.bits >> 10) & 0x1fu;
  const uint32_t man = v.bits & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return std::bit_cast<float>(sign);
    // Subnormal: value = man * 2^-24, exact in float.
    float mag = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

inline f16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16_t{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow to inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: let the FPU round |f| * 2^24 to an integer (ties to even).
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;
#if defined(__clang__) && __clang_major__ < 15
    // Clang 14 (the fuzz build's) has no roundeven builtin; rint rounds ties to even in the default mode.
    const float rounded = __builtin_rintf(scaled);
#else
    const float rounded = __builtin_roundevenf(scaled);
#endif
    return f16_t{static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded))};
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);  // round mantissa from 23 to 10 bits
  r -= 112u << 23;                                 // rebias exponent 127 -> 15
  return f16_t{static_cast<uint16_t>(sign | (r >> 13))};
}

}  // namespace kiln
