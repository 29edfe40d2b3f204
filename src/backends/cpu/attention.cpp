// "scaled_dot_product_attention" on the CPU: splits the work into (batch, head, query tile) items across
// OpenMP threads, packs each head's K and V once per thread into the micro-kernels' layouts, and runs the
// per-ISA tile kernel (isa/attention_tile.cpp) on each query tile. Scores exist only one tile at a time.
#include "backends/cpu/attention.h"

#include <omp.h>

#include <cstring>
#include <memory>

#include "backends/cpu/attention_tile.h"
#include "backends/cpu/cpu_features.h"
#include "backends/cpu/matmul_path.h"
#include "backends/cpu/register_kernels.h"
#include "kiln/core/storage.h"

namespace kiln::cpu_kernels {

namespace {

struct TileKernels {
  void (*pack_rows)(const AttnMatrix&, AttnMath, void*, int64_t);
  void (*pack_keys)(const AttnMatrix&, AttnMath, void*, int64_t, int64_t);
  void (*pack_values)(const AttnMatrix&, AttnMath, void*, int64_t, int64_t);
  void (*query_tile)(const AttnTileArgs&);
};

TileKernels tile_kernels(AttnKernel kernel) {
  if (kernel != AttnKernel::Generic) {
    return {avx512::attn_pack_rows, avx512::attn_pack_keys, avx512::attn_pack_values,
            avx512::attn_query_tile};
  }
  return {generic::attn_pack_rows, generic::attn_pack_keys, generic::attn_pack_values,
          generic::attn_query_tile};
}

// Address of element (b, h, i, 0) of a 4-d tensor.
const char* element(const Tensor& t, int64_t b, int64_t h, int64_t i) {
  return static_cast<const char*>(t.raw_data()) +
         (b * t.stride(0) + h * t.stride(1) + i * t.stride(2)) * static_cast<int64_t>(t.element_size());
}

// bf16 operands widened to float32 for the products: where f32 FMA is this host's faster path (matmul_path.h)
// and the kernel is not AMX's.
bool widens_bf16(DType dtype, AttnKernel kernel) {
  return dtype == bfloat16 && kernel != AttnKernel::Amx && bf16_path() == Bf16Path::Fma32;
}

void attention_kernel(const runtime::OpCall& call) {
  const Tensor bias = call.inputs.size() > 3 ? call.inputs[3] : Tensor();
  const AttnKernel kernel = default_attn_kernel(call.inputs[0].dtype());
  attention_forward(call.inputs[0], call.inputs[1], call.inputs[2], bias, call.outputs[0],
                    call.attrs.get_float("scale"), call.attrs.get_bool("is_causal"), kernel,
                    default_attn_tiling(call.inputs[0].dtype(), kernel));
}

}  // namespace

const char* attn_kernel_name(AttnKernel kernel) {
  switch (kernel) {
    case AttnKernel::Generic:
      return "generic";
    case AttnKernel::Avx512:
      return "avx512";
    case AttnKernel::Amx:
      return "amx";
  }
  return "?";
}

AttnKernel default_attn_kernel(DType dtype) {
  if (!use_avx512()) return AttnKernel::Generic;
  return dtype == bfloat16 && bf16_path() == Bf16Path::Amx ? AttnKernel::Amx : AttnKernel::Avx512;
}

AttentionTiling default_attn_tiling(DType dtype, AttnKernel kernel) {
  return kernel == AttnKernel::Amx || widens_bf16(dtype, kernel) ? kWideTiling : AttentionTiling{};
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                       const Tensor& out, double scale, bool causal, AttnKernel kernel,
                       const AttentionTiling& tiling) {
  KILN_CHECK(tiling.query_tile > 0 && tiling.key_tile > 0 && tiling.key_tile % kAttnBlock == 0,
             "scaled_dot_product_attention: bad tiling " << tiling.query_tile << " x " << tiling.key_tile
                                                         << ": expected positive sizes, keys a multiple of "
                                                         << kAttnBlock);
  const int64_t batch = q.size(0), heads = q.size(1), sq = q.size(2), d = q.size(3);
  const int64_t skv = k.size(2), dv = v.size(3);
  if (out.numel() == 0) return;
  KILN_CHECK(
      kernel != AttnKernel::Amx || amx_usable(),
      "scaled_dot_product_attention: the AMX kernel was asked for on a CPU or process without AMX tiles");
  const TileKernels kernels = tile_kernels(kernel);
  // bf16 operands multiply as bf16 pairs (VDPBF16PS or AMX's TDPBF16PS) or, where f32 FMA is this host's
  // faster path, widened exactly to float32 (matmul_path.h); the probabilities then also stay float32
  // instead of rounding to bf16.
  const bool bf16_pairs = q.dtype() == bfloat16 && !widens_bf16(q.dtype(), kernel);
  const AttnMath math = bf16_pairs ? AttnMath::BF16 : AttnMath::F32;
  const bool amx = kernel == AttnKernel::Amx && math == AttnMath::BF16;
  // AMX multiplies 32 elements of the reduction per step: D and the keys padded to that (zeros), key tiles
  // whole steps.
  const int64_t key_step = amx ? kAttnAmxStep : kAttnBlock;
  const size_t elem = attn_elem_size(math);
  const int64_t d_pad = attn_round_up(d, amx ? kAttnAmxStep : attn_pair(math));
  const int64_t skv_pad = attn_round_up(skv, key_step);
  const int64_t dv_pad = attn_round_up(dv, kAttnBlock);
  const int64_t key_tile = attn_round_up(tiling.key_tile, key_step);
  const int64_t q_tile = std::min(tiling.query_tile, sq);
  const int64_t q_rows = attn_layout_rows(q_tile, amx);  // rows of the packed Q tile
  const int64_t q_tiles = (sq + q_tile - 1) / q_tile;
  const int64_t items = batch * heads * q_tiles;

  // Per-thread buffers, allocated up front so that nothing inside the parallel region can throw.
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), items));
  const size_t k_bytes = attn_round_up(static_cast<int64_t>(skv_pad * d_pad * elem), 64);
  const size_t v_bytes = attn_round_up(static_cast<int64_t>(skv_pad * dv_pad * elem), 64);
  const size_t q_bytes = attn_round_up(static_cast<int64_t>(q_rows * d_pad * elem), 64);
  const size_t scratch_bytes = attn_round_up(
      static_cast<int64_t>(attn_scratch_floats(q_tile, key_tile, dv_pad, amx) * sizeof(float)), 64);
  const size_t per_thread = k_bytes + v_bytes + q_bytes + scratch_bytes;
  // From the CPU allocator's cache: an eager step calls attention once per block with the same sizes, and a
  // fresh buffer of several MB each call would be page-faulted in again every time.
  const std::shared_ptr<Storage> buffers = Storage::allocate(per_thread * static_cast<size_t>(threads), cpu);
  char* const buffer_base = static_cast<char*>(buffers->data());

  AttnTileArgs base;
  base.math = math;
  base.amx = amx;
  base.d_pad = d_pad;
  base.skv = skv;
  base.skv_pad = skv_pad;
  base.dv = dv;
  base.dv_pad = dv_pad;
  base.key_tile = key_tile;
  base.scale = static_cast<float>(scale);
  base.causal = causal;
  if (bias.defined()) {
    base.bias_dtype = bias.dtype();
    base.bias_row_stride = bias.stride(2);
    base.bias_col_stride = bias.stride(3);
  }
  base.out_dtype = out.dtype();
  base.out_row_stride = out.stride(2);

#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    // Contiguous ranges of items: a thread meets each of its heads once and packs its K and V once.
    const int64_t begin = items * t / nt, end = items * (t + 1) / nt;
    char* mine = buffer_base + per_thread * static_cast<size_t>(t);
    void* k_pack = mine;
    void* v_pack = mine + k_bytes;
    void* q_pack = mine + k_bytes + v_bytes;
    float* scratch = reinterpret_cast<float*>(mine + k_bytes + v_bytes + q_bytes);
    int64_t packed_head = -1;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t bh = item / q_tiles, b = bh / heads, h = bh % heads;
      const int64_t q_first = (item % q_tiles) * q_tile;
      const int64_t rows = std::min(q_tile, sq - q_first);
      if (bh != packed_head) {
        kernels.pack_keys({element(k, b, h, 0), k.dtype(), skv, d, k.stride(2)}, math, k_pack, skv_pad,
                          d_pad);
        kernels.pack_values({element(v, b, h, 0), v.dtype(), skv, dv, v.stride(2)}, math, v_pack, skv_pad,
                            dv_pad);
        packed_head = bh;
      }
      kernels.pack_rows({element(q, b, h, q_first), q.dtype(), rows, d, q.stride(2)}, math, q_pack, d_pad);
      // AMX reads whole 16-row tiles: the rows past this tile's last are zeros.
      const int64_t rows_read = attn_layout_rows(rows, amx);
      std::memset(static_cast<char*>(q_pack) + rows * d_pad * elem, 0,
                  static_cast<size_t>((rows_read - rows) * d_pad) * elem);
      AttnTileArgs args = base;
      args.q = q_pack;
      args.rows = rows;
      args.q_first = q_first;
      args.k = k_pack;
      args.v = v_pack;
      if (bias.defined()) args.bias = element(bias, b, h, q_first);
      args.out = const_cast<char*>(element(out, b, h, q_first));
      args.scratch = scratch;
      kernels.query_tile(args);
    }
  }
}

void register_attention_kernels(runtime::KernelRegistry& registry) {
  registry.add("scaled_dot_product_attention", DeviceType::CPU, attention_kernel);
}

}  // namespace kiln::cpu_kernels
