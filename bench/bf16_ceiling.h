// The bf16 ceiling of this machine, measured now on register-only loops of its best bf16 instruction:
// AMX `tdpbf16ps` (16x16 tile of float32 += 16x32 by 32x16 bf16 tiles, 16384 FLOP an instruction) where the
// CPU and the OS allow it, else AVX-512 `vdpbf16ps` (16 lanes x 2 products, 64 FLOP). MFU is reported against
// this figure, so on an AMX host it is the tile rate, not the vector one (issue #12: measuring vdpbf16ps
// there gave MFUs of 300-400%).
#pragma once

#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>

#include "backends/cpu/cpu_features.h"

namespace kiln::bench {

// 24 independent VDPBF16PS chains on registers for about `seconds`: FLOP per wall-clock second on this core.
__attribute__((target("avx512f,avx512bf16"))) inline double dpbf16_rate(double seconds) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512i a = _mm512_set1_epi32(0x3f803f80), b = _mm512_set1_epi32(0x00010001);
  constexpr long kChunk = 200000;
  long iterations = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (long i = 0; i < kChunk; ++i) {
      asm volatile("" : "+v"(a), "+v"(b));  // keeps the operands opaque so the loop is not folded
#pragma GCC unroll 24
      for (int j = 0; j < 24; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)a, (__m512bh)b);
    }
    iterations += kChunk;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  float sink = 0;
  for (int i = 0; i < 24; ++i) sink += acc[i][0];
  asm volatile("" : : "x"(sink));
  return static_cast<double>(iterations) * 24 * 64.0 / elapsed;
}

// The AMX tile configuration (palette 1) as LDTILECFG reads it: 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Linux hands out the AMX tile state only to processes that ask for it (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); without it the first tile instruction faults.
inline bool request_amx_permission() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

// Four independent TDPBF16PS accumulators (tmm0-3) fed by two A tiles and two B tiles, for about `seconds`:
// FLOP per wall-clock second on this core.
__attribute__((target("amx-tile,amx-bf16"))) inline double tdpbf16_rate(double seconds) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&config);
  alignas(64) static const uint16_t zeros[16 * 32] = {};
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, zeros, 64);
  _tile_loadd(5, zeros, 64);
  _tile_loadd(6, zeros, 64);
  _tile_loadd(7, zeros, 64);
  constexpr long kChunk = 100000;
  long iterations = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (long i = 0; i < kChunk; ++i) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    iterations += kChunk;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  _tile_release();
  return static_cast<double>(iterations) * 4 * (2.0 * 16 * 16 * 32) / elapsed;
}

struct Bf16Ceiling {
  double gflops = 0;                 // all OpenMP threads together; 0 when the CPU has no bf16 instruction
  const char* instruction = "none";  // "tdpbf16ps (AMX)" or "vdpbf16ps (AVX-512)"
};

// Measured on every OpenMP thread at once for about `seconds` (wall clock, so a busy host lowers it as it
// lowers the step being compared with it).
inline Bf16Ceiling measure_bf16_ceiling(double seconds = 0.5) {
  const auto& cpu = kiln::cpu_kernels::cpu_features();
  const bool amx = cpu.amx_bf16 && request_amx_permission();
  Bf16Ceiling c;
  if (!amx && !cpu.avx512_bf16) return c;
  c.instruction = amx ? "tdpbf16ps (AMX)" : "vdpbf16ps (AVX-512)";
  double total = 0;
#pragma omp parallel reduction(+ : total)
  total += amx ? tdpbf16_rate(seconds) : dpbf16_rate(seconds);
  c.gflops = total / 1e9;
  return c;
}

}  // namespace kiln::bench
