// What a module is lowered for: the PJRT platform whose plugin compiles it, and the choices that follow from
// it. Most lowerings are the same everywhere; attention on NVIDIA GPUs becomes XLA's cuDNN fused-attention
// custom call (lower_fused.cpp), which no other platform's compiler knows. The target is part of every
// module's text whenever it changes what is emitted, so the executable caches (keyed by the text, and on disk
// also by the platform) never hand one platform's executable to another.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/core/dtype.h"

namespace kiln::pjrt::hlo {

struct LoweringTarget {
  std::string platform = "cpu";  // the PJRT client's platform name: "cpu", "cuda", "tpu"
  // scaled_dot_product_attention as `__cudnn$fmhaSoftmax` where its shapes and dtypes allow (bf16/f16, no
  // bias, head dim a multiple of 8 up to 128); elsewhere the plain composition.
  bool cudnn_attention = false;
  // scaled_dot_product_attention over more keys than this (0: never) as a loop over blocks of this many
  // keys with a running softmax (flash attention's arithmetic in plain StableHLO), so a TPU, which gets no
  // fused attention, holds one block's scores at a time instead of all of them (f32 [B, H, S, S]: 2 GiB for
  // FLUX at 1024x1024). Where neither applies (a bias, cuDNN not taking the call), the plain composition.
  int64_t attention_key_block = 0;
};

// Whether modules lowered for `a` and for `b` have the same text: every choice but the platform name is the
// same (the platform itself is never written into a module).
inline bool emits_the_same(const LoweringTarget& a, const LoweringTarget& b) {
  return a.cudnn_attention == b.cudnn_attention && a.attention_key_block == b.attention_key_block;
}

// The target for a client of `platform`: on "cuda", cudnn_attention unless KILN_PJRT_FUSED_ATTENTION=0; on
// "tpu", attention over blocks of 256 keys; KILN_PJRT_ATTENTION_KEY_BLOCK=N sets the block on any platform
// (0: never). Both are read at each call, so a process may switch; the module text, hence the cache key,
// changes with them.
LoweringTarget lowering_target(std::string_view platform);

// Whether cuDNN's fused attention takes q, k and v of `dtype` with head dim `head_dim`: a 16-bit dtype and a
// head dim that is a multiple of 8 up to 128 (lower_fused.cpp, which also needs one dtype for all three and
// no bias).
bool cudnn_attention_takes(DType dtype, int64_t head_dim);

// The key block of attention on a device of `platform` (LoweringTarget::attention_key_block) for a call
// without a bias; 0 when attention there is composed whole or fused.
int64_t attention_key_block(std::string_view platform, DType dtype, int64_t head_dim);

}  // namespace kiln::pjrt::hlo
