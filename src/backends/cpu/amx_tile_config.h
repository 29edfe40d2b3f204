// The AMX tile configuration every user of the tiles in Kiln loads: eight tiles of 16 rows x 64 bytes
// (palette 1). Shared by the instruction probe (instruction_rates.cpp) and the tile kernels
// (isa/amx_tiles.h). Only for code that has checked amx_usable() (cpu_features.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace kiln::cpu_kernels {

// LDTILECFG's 64-byte operand.
struct alignas(64) AmxTileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Loads the configuration on the calling thread. Cheap enough to run per call: other code on the thread
// (oneDNN's AMX kernels) may have loaded its own.
__attribute__((target("amx-tile"))) inline void load_amx_tile_config() {
  AmxTileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.bytes_per_row[t] = 64;
  }
  // GCC 12 does not see LDTILECFG read the struct and may drop the stores above without this barrier (it
  // did in the attention kernel: the tiles then fault as unconfigured).
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

}  // namespace kiln::cpu_kernels
