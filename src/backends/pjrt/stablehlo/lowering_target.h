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
};

// Whether modules lowered for `a` and for `b` have the same text: every choice but the platform name is the
// same (the platform itself is never written into a module).
inline bool emits_the_same(const LoweringTarget& a, const LoweringTarget& b) {
  return a.cudnn_attention == b.cudnn_attention;
}

// The target for a client of `platform`: on "cuda", cudnn_attention unless KILN_PJRT_FUSED_ATTENTION=0 (read
// at each call, so a process may switch; the module text, hence the cache key, changes with it).
LoweringTarget lowering_target(std::string_view platform);

// Whether cuDNN's fused attention takes q, k and v of `dtype` with head dim `head_dim`: a 16-bit dtype and a
// head dim that is a multiple of 8 up to 128 (lower_fused.cpp, which also needs one dtype for all three and
// no bias).
bool cudnn_attention_takes(DType dtype, int64_t head_dim);

}  // namespace kiln::pjrt::hlo
