// "copy": writes inputs[0] (already broadcast to the output's shape) into outputs[0], converting dtype.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>

#include "backends/cpu/copy.h"
#include "backends/cpu/isa_dispatch.h"
#include "backends/cpu/register_kernels.h"
#include "backends/cpu/strided_loop.h"

namespace kiln::cpu_kernels {

KILN_ISA_DECLARE(bool, cast_contiguous, (const void* src, DType from, void* dst, DType to, int64_t n));

namespace {

// The dtypes whose contiguous conversions cast_contiguous (isa/cast.cpp) vectorizes.
template <class T>
inline constexpr bool is_vector_float =
    std::is_same_v<T, float> || std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>;

template <class From, class To>
inline To convert(From v) {
  if constexpr (std::is_same_v<From, To>) {
    return v;
  } else if constexpr (std::is_same_v<To, bf16_t> && std::is_same_v<From, float>) {
    return f32_to_bf16(v);
  } else if constexpr (std::is_same_v<To, float> && std::is_same_v<From, bf16_t>) {
    return bf16_to_f32(v);
  } else if constexpr (std::is_same_v<To, f16_t> && std::is_same_v<From, float>) {
    return f32_to_f16(v);
  } else if constexpr (std::is_same_v<To, float> && std::is_same_v<From, f16_t>) {
    return f16_to_f32(v);
  } else if constexpr (std::is_same_v<To, bool>) {
    return scalar_to_double(v) != 0.0;
  } else if constexpr (std::is_floating_point_v<To> || std::is_same_v<To, bf16_t> ||
                       std::is_same_v<To, f16_t>) {
    // Through double: exact for every source except int64 beyond 2^53, where torch rounds the same way.
    if constexpr (std::is_same_v<To, bf16_t> || std::is_same_v<To, f16_t>) {
      return scalar_from_double<To>(static_cast<float>(scalar_to_double(v)));
    } else {
      return static_cast<To>(scalar_to_double(v));
    }
  } else {
    // To an integer: truncate toward zero like torch's .to(int).
    if constexpr (std::is_same_v<From, bf16_t> || std::is_same_v<From, f16_t>) {
      return static_cast<To>(scalar_to_double(v));
    } else {
      return static_cast<To>(v);
    }
  }
}

// Converts one run of n elements, each side with its byte stride. The walks below take it as a pointer: they
// are compiled once rather than once per pair of dtypes.
using CopyRunFn = void (*)(const char* src, char* dst, int64_t n, int64_t src_stride, int64_t dst_stride);

template <class From, class To>
void copy_run(const char* src, char* dst, int64_t n, int64_t src_stride, int64_t dst_stride) {
  if (src_stride == sizeof(From) && dst_stride == sizeof(To)) {
    if constexpr (std::is_same_v<From, To>) {
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(To));
    } else if constexpr (is_vector_float<From> && is_vector_float<To>) {
      KILN_ISA_CALL(cast_contiguous)(src, dtype_of_v<From>, dst, dtype_of_v<To>, n);
    } else {
      const From* __restrict s = reinterpret_cast<const From*>(src);
      To* __restrict d = reinterpret_cast<To*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = convert<From, To>(s[i]);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    From v;
    std::memcpy(&v, src + i * src_stride, sizeof(From));
    const To r = convert<From, To>(v);
    std::memcpy(dst + i * dst_stride, &r, sizeof(To));
  }
}

// Side of the square tiles a transposing copy moves at a time: 32 x 32 elements read 32 source lines whole
// (64 bytes of a 2-byte dtype each) and write 32 output rows, all within L1.
constexpr int64_t kTransposeTile = 32;

// Where a copy's output runs read the source with a stride while an outer dimension reads it contiguously:
// the merged iteration, its innermost dimension and the outer one along which the source is contiguous.
struct TransposedLayout {
  StridedIteration<2> it;
  int inner = -1, across = -1;
};

std::optional<TransposedLayout> transposed_layout(const Shape& shape, const Strides& dst_strides,
                                                  const Strides& src_strides, int64_t src_elem) {
  TransposedLayout t;
  t.it = merge_dims<2>(shape, {dst_strides, src_strides});
  const int dims = static_cast<int>(t.it.sizes.size());
  t.inner = dims - 1;
  if (dims < 2 || t.it.sizes[t.inner] < kTransposeTile) return std::nullopt;
  const int64_t inner_stride = t.it.strides[t.inner][1];
  if (inner_stride == src_elem || inner_stride == 0) return std::nullopt;
  for (int d = t.inner - 1; d >= 0 && t.across < 0; --d) {
    if (t.it.strides[d][1] == src_elem && t.it.sizes[d] >= kTransposeTile) t.across = d;
  }
  if (t.across < 0) return std::nullopt;
  return t;
}

// Such a copy, tile by tile: run by run, each output row would touch one element per source cache line and
// fetch every line again for each index of the other dimension (64 times over 33 MB for T5's position bias,
// [S, S, H] -> [H, S, S]); tiles of both dimensions use each line whole.
void copy_tiles(const TransposedLayout& t, char* dst, const char* src, int64_t src_elem, CopyRunFn run) {
  const StridedIteration<2>& it = t.it;
  const int inner = t.inner, across = t.across;
  const int64_t rows = it.sizes[across], cols = it.sizes[inner];
  const int64_t row_tiles = (rows + kTransposeTile - 1) / kTransposeTile;
  const int64_t col_tiles = (cols + kTransposeTile - 1) / kTransposeTile;
  int64_t batches = 1;
  for (int d = 0; d < inner; ++d)
    if (d != across) batches *= it.sizes[d];
  const int64_t items = batches * row_tiles * col_tiles;
  const int64_t dst_row = it.strides[across][0], dst_col = it.strides[inner][0];
  const int64_t src_col = it.strides[inner][1];

  auto tile = [&](int64_t item) {
    const int64_t col_tile = item % col_tiles, row_tile = item / col_tiles % row_tiles;
    int64_t batch = item / (col_tiles * row_tiles);
    char* d0 = dst;
    const char* s0 = src;
    for (int d = inner - 1; d >= 0; --d) {
      if (d == across) continue;
      const int64_t idx = batch % it.sizes[d];
      batch /= it.sizes[d];
      d0 += idx * it.strides[d][0];
      s0 += idx * it.strides[d][1];
    }
    const int64_t r0 = row_tile * kTransposeTile, r1 = std::min(rows, r0 + kTransposeTile);
    const int64_t c0 = col_tile * kTransposeTile, c1 = std::min(cols, c0 + kTransposeTile);
    for (int64_t r = r0; r < r1; ++r)
      run(s0 + r * src_elem + c0 * src_col, d0 + r * dst_row + c0 * dst_col, c1 - c0, src_col, dst_col);
  };
  if (items * kTransposeTile * kTransposeTile < kParallelGrain || omp_in_parallel() || items == 1) {
    for (int64_t i = 0; i < items; ++i) tile(i);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < items; ++i) tile(i);
  }
}

void copy_kernel(const runtime::OpCall& call) {
  copy_tensor(call.inputs[0], call.outputs[0]);
}

}  // namespace

bool copy_reads_transposed(const Tensor& src, const Tensor& dst) {
  return transposed_layout(dst.shape(), byte_strides(dst), byte_strides(src),
                           static_cast<int64_t>(src.element_size()))
      .has_value();
}

void copy_tensor(const Tensor& src, const Tensor& dst) {
  if (dst.numel() == 0) return;
  const std::optional<TransposedLayout> transposed = transposed_layout(
      dst.shape(), byte_strides(dst), byte_strides(src), static_cast<int64_t>(src.element_size()));
  CopyRunFn run = nullptr;
  visit_dtype(src.dtype(), [&](auto from) {
    visit_dtype(dst.dtype(), [&](auto to) { run = copy_run<decltype(from), decltype(to)>; });
  });
  if (transposed) {
    copy_tiles(*transposed, static_cast<char*>(dst.raw_data()), static_cast<const char*>(src.raw_data()),
               static_cast<int64_t>(src.element_size()), run);
    return;
  }
  for_each_run<2>(dst.shape(), {static_cast<char*>(dst.raw_data()), static_cast<char*>(src.raw_data())},
                  {byte_strides(dst), byte_strides(src)},
                  [run](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> s) {
                    run(p[1], p[0], n, s[1], s[0]);
                  });
}

void register_copy_kernels(runtime::KernelRegistry& registry) {
  registry.add("copy", DeviceType::CPU, copy_kernel);
}

}  // namespace kiln::cpu_kernels
