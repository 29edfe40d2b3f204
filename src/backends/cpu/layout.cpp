// CPU kernels for the layout ops: "concat", "embedding", "upsample_nearest2d" (byte copies, any dtype) and
// "rope" (vectorized, in isa/rope_kernels.cpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/reduction_kernels.h"
#include "backends/cpu/register_kernels.h"
#include "ops/nearest_index.h"

namespace kiln::cpu_kernels {

namespace {

// Copies below this many bytes run on one thread.
constexpr int64_t kParallelBytes = 1 << 18;
// Rows longer than this are copied in pieces of this size, so that a concat along dim 1 of batch-1 tensors
// (one long row per input: FLUX's text + image q, k and v) still uses every thread.
constexpr int64_t kPieceBytes = 1 << 16;

// inputs: contiguous tensors of the output's dtype; attrs: dim.
void concat_kernel(const runtime::OpCall& call) {
  const Tensor& out = call.outputs[0];
  const int64_t d = call.attrs.get_int("dim");
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < d; ++k) outer *= out.size(k);
  for (int64_t k = d + 1; k < out.dim(); ++k) inner *= out.size(k);
  const int64_t es = static_cast<int64_t>(out.element_size());
  const int64_t out_row = out.size(d) * inner * es;
  char* dst = static_cast<char*>(out.raw_data());
  int64_t offset = 0;
  for (const Tensor& t : call.inputs) {
    const int64_t row = t.size(d) * inner * es;
    const char* src = static_cast<const char*>(t.raw_data());
    const int64_t pieces_per_row = std::max<int64_t>(1, (row + kPieceBytes - 1) / kPieceBytes);
    const int64_t piece = (row + pieces_per_row - 1) / pieces_per_row;
    const int64_t pieces = outer * pieces_per_row;
#pragma omp parallel for schedule(static) if (outer * row >= kParallelBytes && pieces > 1)
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t o = p / pieces_per_row, begin = p % pieces_per_row * piece;
      const int64_t bytes = std::min(piece, row - begin);
      if (bytes > 0) std::memcpy(dst + o * out_row + offset + begin, src + o * row + begin, bytes);
    }
    offset += row;
  }
}

// inputs: weight [V, D] contiguous, ids contiguous int32/int64; output [*ids, D].
void embedding_kernel(const runtime::OpCall& call) {
  const Tensor& weight = call.inputs[0];
  const Tensor& ids = call.inputs[1];
  const Tensor& out = call.outputs[0];
  const int64_t vocab = weight.size(0), n = ids.numel();
  const size_t row = static_cast<size_t>(weight.size(1)) * weight.element_size();
  auto id_at = [&](int64_t i) {
    return ids.dtype() == int64 ? static_cast<const int64_t*>(ids.raw_data())[i]
                                : static_cast<int64_t>(static_cast<const int32_t*>(ids.raw_data())[i]);
  };
  // Validate before copying: an exception must not escape an OpenMP region.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = id_at(i);
    KILN_CHECK(id >= 0 && id < vocab, "embedding: id " << id << " at position " << i << " of ids "
                                                       << shape_str(ids.shape()) << " is out of range [0, "
                                                       << vocab << ")");
  }
  const char* w = static_cast<const char*>(weight.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
#pragma omp parallel for schedule(static) if (n * static_cast <int64_t>(row) >= kParallelBytes)
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * row, w + id_at(i) * row, row);
}

template <class T>
void upsample_typed(const T* x, T* y, int64_t planes, int64_t ih, int64_t iw, int64_t oh, int64_t ow,
                    const std::vector<int64_t>& src_y, const std::vector<int64_t>& src_x) {
#pragma omp parallel for schedule(static) if (planes * oh * ow * static_cast <int64_t>(sizeof(T)) >= \
                                              kParallelBytes)
  for (int64_t task = 0; task < planes * oh; ++task) {
    const int64_t p = task / oh, oy = task % oh;
    const T* in_row = x + (p * ih + src_y[oy]) * iw;
    T* out_row = y + task * ow;
    for (int64_t ox = 0; ox < ow; ++ox) out_row[ox] = in_row[src_x[ox]];
  }
}

// inputs: x [N, C, H, W] contiguous; attrs: scale (0 when an output size was given).
void upsample_nearest2d_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& y = call.outputs[0];
  const int64_t scale = call.attrs.get_int("scale");
  const int64_t ih = x.size(2), iw = x.size(3), oh = y.size(2), ow = y.size(3);
  std::vector<int64_t> src_y(oh), src_x(ow);
  for (int64_t i = 0; i < oh; ++i) src_y[i] = ops::nearest_source(i, ih, oh, scale);
  for (int64_t i = 0; i < ow; ++i) src_x[i] = ops::nearest_source(i, iw, ow, scale);
  const int64_t planes = x.size(0) * x.size(1);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    upsample_typed(static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), planes, ih, iw, oh, ow,
                   src_y, src_x);
  };
  switch (x.element_size()) {
    case 1:
      run(uint8_t{});
      break;
    case 2:
      run(uint16_t{});
      break;
    case 4:
      run(uint32_t{});
      break;
    case 8:
      run(uint64_t{});
      break;
    default:
      KILN_FAIL("upsample_nearest2d: unsupported element size " << x.element_size());
  }
}

// inputs: x [B, H, S, D] (last dim contiguous), cos and sin float32 [S, D]; output [B, H, S, D] (last dim
// contiguous); attrs: style.
void rope_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& y = call.outputs[0];
  RopeShape shape{x.size(0),
                  x.size(1),
                  x.size(2),
                  x.size(3),
                  {x.stride(0), x.stride(1), x.stride(2)},
                  {y.stride(0), y.stride(1), y.stride(2)}};
  KILN_ISA_CALL(rope)
  (static_cast<RopeStyle>(call.attrs.get_int("style")), x.dtype(), x.raw_data(), shape,
   static_cast<const float*>(call.inputs[1].raw_data()), static_cast<const float*>(call.inputs[2].raw_data()),
   call.outputs[0].raw_data());
}

}  // namespace

void register_layout_kernels(runtime::KernelRegistry& registry) {
  registry.add("concat", DeviceType::CPU, concat_kernel);
  registry.add("embedding", DeviceType::CPU, embedding_kernel);
  registry.add("upsample_nearest2d", DeviceType::CPU, upsample_nearest2d_kernel);
  registry.add("rope", DeviceType::CPU, rope_kernel);
}

}  // namespace kiln::cpu_kernels
