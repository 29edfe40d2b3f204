// What Kiln's own GEMM drivers (gemm_fma32.cpp, gemm_amx.cpp) share: rounding, the rows of a work item, and
// each thread's buffer for packed operands and accumulators.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "kiln/core/error.h"

namespace kiln::cpu_kernels {

inline int64_t ceil_div(int64_t x, int64_t m) {
  return (x + m - 1) / m;
}
inline int64_t round_up(int64_t x, int64_t m) {
  return ceil_div(x, m) * m;
}

// Rows per work item of an M-row output cut into `col_blocks` column blocks: up to `max_rows`, in multiples
// of `multiple`, but shortened (down to `min_rows`) until each of `threads` threads gets `items_per_thread`
// items, so that no core idles through the last one (a narrow output would otherwise be one or two items).
// Shorter row blocks pack or widen the weight more often.
inline int64_t gemm_row_block(int64_t m, int64_t col_blocks, int threads, int64_t max_rows, int64_t min_rows,
                              int64_t multiple, int64_t items_per_thread) {
  int64_t row_block = std::min(round_up(max_rows, multiple), round_up(m, multiple));
  if (ceil_div(m, row_block) * col_blocks < items_per_thread * threads) {
    const int64_t wanted_row_blocks = ceil_div(items_per_thread * threads, col_blocks);
    row_block = std::min(row_block, std::max(round_up(ceil_div(m, wanted_row_blocks), multiple),
                                             round_up(min_rows, multiple)));
  }
  return row_block;
}

// A thread's GEMM buffers, 64-byte aligned; grows to the largest size this thread has needed.
class GemmThreadBuffer {
 public:
  ~GemmThreadBuffer() { std::free(data_); }
  char* get(size_t bytes) {
    if (bytes > capacity_) {
      std::free(data_);
      capacity_ = static_cast<size_t>(round_up(static_cast<int64_t>(bytes), 4096));
      data_ = static_cast<char*>(std::aligned_alloc(64, capacity_));
      KILN_CHECK(data_ != nullptr,
                 "linear: out of memory allocating " << capacity_ << " bytes of GEMM buffers");
    }
    return data_;
  }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace kiln::cpu_kernels
