// Matrix products and convolution (CPU: oneDNN). Accumulation is always float32; the output has the
// inputs' dtype. float32 and bfloat16 run natively; float16 is computed in float32 (this CPU has no
// AVX512-FP16, which oneDNN's f16 kernels need) and rounded once to float16 at the end. Operands must share
// a dtype: mixed inputs (bfloat16 x with a float32 weight) throw, as torch does; convert one explicitly.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "kiln/core/tensor.h"

namespace kiln {

// torch.nn.functional.linear: x [..., K] (any layout), weight [N, K] as stored by torch, optional bias [N]
// -> [..., N]. The bias may also be float32 with a bfloat16/float16 x; it is added in float32 before the
// single rounding to the output dtype.
//
// The weight is reordered once into oneDNN's preferred blocked layout (see set_weight_prepacking) and the
// packed copy is cached on the weight's Storage, keyed by the view (offset, shape, strides, dtype), so
// every later call with that weight reuses it and it is freed with the weight.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

// torch.matmul: a [..., M, K] @ b [..., K, N] -> [broadcast(...), M, N]. Batch dims broadcast; a 1-D a is
// a row vector and a 1-D b a column vector, with that dim dropped from the result, as in torch.
// Transposed and permuted views (k.transpose(-1, -2), heads split out of [B, S, H, D]) are used in place.
Tensor matmul(const Tensor& a, const Tensor& b);

// torch.nn.functional.conv2d: x [N, C, H, W] (or unbatched [C, H, W]), weight [O, C / groups, kh, kw],
// optional bias [O] -> [N, O, Ho, Wo] with Ho = (H + 2 ph - dh (kh - 1) - 1) / sh + 1 (likewise Wo).
// The weight is reordered once into the primitive's layout and cached on its Storage, as for linear.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
              std::array<int64_t, 2> stride = {1, 1}, std::array<int64_t, 2> padding = {0, 0},
              std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);

// Whether linear keeps a packed copy of a weight (float16 weights always get a packed float32 copy:
// converting them on every call would cost more than the product).
//  Auto (default): bfloat16 weights are packed (10-13% faster than the stored [N, K] layout on this CPU,
//    and bf16 weights are usually memory-mapped file pages the kernel can drop, so the copy is the only
//    resident one); float32 weights are used in place (packing gains 1-4% and f32 weights are usually
//    owned converted copies, so packing would double their resident memory).
//  Always / Never: for all dtypes. The environment variable KILN_PREPACK_WEIGHTS=auto|1|0 sets the initial
//  policy. Packed copies live until their weight's Storage is freed (or Storage::clear_derived()).
enum class WeightPrepacking { Auto, Always, Never };
void set_weight_prepacking(WeightPrepacking policy);
WeightPrepacking weight_prepacking();
// Whether, under the current policy, a weight of this dtype is used through its packed copy (linear and
// linear_fused apply the same rule, so both find one packed copy of a weight).
bool weight_is_prepacked(DType weight_dtype);

// The most bytes that packed weight copies may hold at once, process-wide (std::nullopt: no limit, the
// default). A packed copy is anonymous memory the OS cannot reclaim, while a weight read in place from a
// memory-mapped checkpoint lives in the page cache, which it can. A weight whose copy would exceed the budget
// is therefore read in place by linear (0-12% slower on bf16 matmuls, cpu-limits.md section 2) and reordered
// per call by conv2d. Copies already made stay until their weight is freed; lowering the budget only affects
// later packing. Pipelines set it when they load (see PipelineLoadOptions::packed_weights).
void set_packed_weight_budget(std::optional<int64_t> bytes);
std::optional<int64_t> packed_weight_budget();
// Bytes the packed weight copies hold now.
int64_t packed_weight_bytes();

// The most bytes of weights read in place from memory-mapped checkpoints that the process keeps resident
// (std::nullopt: no limit, the default). Before a kernel reads such a weight, the least recently read ones
// beyond the budget are dropped from the process (Storage::drop_resident_pages): they stay in the page cache,
// so reading them again maps them back without a disk read while the OS has memory for them. With it (and no
// packed copies) the process's resident set follows the budget, not the model: sequential offload on a host
// without an accelerator. One weight is always kept, so a budget below the largest weight holds that weight.
void set_resident_weight_budget(std::optional<int64_t> bytes);
std::optional<int64_t> resident_weight_budget();

}  // namespace kiln
