// Walks N operands that share one iteration shape, each with its own strides, and hands the callback
// the innermost contiguous-in-iteration runs: fn(std::array<char*, N> ptrs, int64_t n, std::array<int64_t, N>
// inner_byte_strides). Dimensions of size 1 are dropped and dimensions that are contiguous with their
// neighbour in every operand are merged, so a contiguous tensor becomes one long run. Large iterations are
// split across OpenMP threads by outer index; operands must therefore not alias an output.
#pragma once

#include <omp.h>

#include <array>
#include <cstdint>
#include <vector>

#include "kiln/core/shape.h"

namespace kiln::cpu_kernels {

template <size_t N>
struct StridedIteration {
  std::vector<int64_t> sizes;                   // merged sizes, innermost last
  std::vector<std::array<int64_t, N>> strides;  // byte strides per merged dim and operand
};

template <size_t N>
StridedIteration<N> merge_dims(const Shape& shape, const std::array<Strides, N>& byte_strides) {
  StridedIteration<N> it;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    std::array<int64_t, N> s;
    for (size_t k = 0; k < N; ++k) s[k] = byte_strides[k][d];
    if (!it.sizes.empty()) {
      bool mergeable = true;
      for (size_t k = 0; k < N; ++k) mergeable &= it.strides.back()[k] == s[k] * shape[d];
      if (mergeable) {
        it.sizes.back() *= shape[d];
        it.strides.back() = s;
        continue;
      }
    }
    it.sizes.push_back(shape[d]);
    it.strides.push_back(s);
  }
  if (it.sizes.empty()) {  // a single element
    it.sizes.push_back(1);
    it.strides.push_back({});
  }
  return it;
}

// Threads are used only when there are at least this many elements in total.
inline constexpr int64_t kParallelGrain = 1 << 15;

template <size_t N, class F>
void for_each_run(const Shape& shape, std::array<char*, N> base, const std::array<Strides, N>& byte_strides,
                  F&& fn) {
  for (int64_t d : shape)
    if (d == 0) return;
  const StridedIteration<N> it = merge_dims<N>(shape, byte_strides);
  const int64_t inner = it.sizes.back();
  const std::array<int64_t, N> inner_strides = it.strides.back();
  const int outer_dims = static_cast<int>(it.sizes.size()) - 1;
  int64_t outer = 1;
  for (int d = 0; d < outer_dims; ++d) outer *= it.sizes[d];

  auto run_range = [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      std::array<char*, N> ptrs = base;
      int64_t rem = o;
      for (int d = outer_dims - 1; d >= 0; --d) {
        const int64_t idx = rem % it.sizes[d];
        rem /= it.sizes[d];
        for (size_t k = 0; k < N; ++k) ptrs[k] += idx * it.strides[d][k];
      }
      fn(ptrs, inner, inner_strides);
    }
  };

  const int64_t total = outer * inner;
  if (total < kParallelGrain || omp_in_parallel()) {
    run_range(0, outer);
    return;
  }
  if (outer == 1) {
    // One long run: split it into chunks instead.
    const int threads = omp_get_max_threads();
    const int64_t chunk = (inner + threads - 1) / threads;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < threads; ++t) {
      const int64_t begin = t * chunk;
      const int64_t end = begin + chunk < inner ? begin + chunk : inner;
      if (begin >= end) continue;
      std::array<char*, N> ptrs = base;
      for (size_t k = 0; k < N; ++k) ptrs[k] += begin * inner_strides[k];
      fn(ptrs, end - begin, inner_strides);
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < outer; ++o) run_range(o, o + 1);
}

// Byte strides of a tensor, for for_each_run.
template <class TensorT>
Strides byte_strides(const TensorT& t) {
  Strides s = t.strides();
  for (auto& v : s) v *= static_cast<int64_t>(t.element_size());
  return s;
}

}  // namespace kiln::cpu_kernels
