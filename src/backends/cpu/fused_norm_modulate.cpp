// "norm_modulate": inputs x [rows, C] contiguous, scale and shift float32 [blocks, C] contiguous; output
// [rows, C] contiguous in x's dtype; attrs kind (NormKind), eps, block_rows (rows per scale/shift row).
#include "backends/cpu/fused_kernels.h"
#include "kiln/core/error.h"
#include "kiln/ops/fused.h"

namespace kiln::cpu_kernels {

void norm_modulate_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& scale = call.inputs[1];
  const Tensor& shift = call.inputs[2];
  const Tensor& y = call.outputs[0];
  KILN_CHECK(
      x.dtype() == float32 || x.dtype() == bfloat16 || x.dtype() == float16,
      "norm_modulate: the cpu kernel supports float32, bfloat16 and float16, got " << dtype_name(x.dtype()));
  const auto kind = static_cast<NormKind>(call.attrs.get_int("kind"));
  KILN_ISA_CALL(norm_modulate_rows)
  (kind == NormKind::LayerNorm, x.dtype(), x.raw_data(), static_cast<const float*>(scale.raw_data()),
   static_cast<const float*>(shift.raw_data()), y.raw_data(), x.size(0), x.size(1),
   call.attrs.get_int("block_rows"), static_cast<float>(call.attrs.get_float("eps")));
}

}  // namespace kiln::cpu_kernels
