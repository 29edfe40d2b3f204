#include "backends/cpu/amx_packed_weights.h"

#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/packed_weight_copies.h"

namespace kiln::cpu_kernels {

namespace {

// The AMX GEMM has one layout (the view alone tells copies apart).
struct AmxTileLayout {
  bool operator==(const AmxTileLayout&) const { return true; }
};

}  // namespace

const uint16_t* amx_packed_weight(const Tensor& weight) {
  const int64_t n = weight.size(0), k = weight.size(1);
  const std::optional<const uint16_t*> packed =
      packed_weight_copies<AmxTileLayout, const uint16_t*>(weight)->get(
          weight, AmxTileLayout{}, (n + 15) / 16 * 16 * k * 2, [&](void* dst) {
            Bf16Gemm g;
            g.w = weight.raw_data();
            g.w_row_stride = weight.stride(0);
            g.w_col_stride = weight.stride(1);
            g.n = n;
            g.k = k;
            avx512::amx_pack_weights(g, 0, n, 0, k, static_cast<uint16_t*>(dst));
            return static_cast<const uint16_t*>(dst);
          });
  return packed.value_or(nullptr);
}

}  // namespace kiln::cpu_kernels
