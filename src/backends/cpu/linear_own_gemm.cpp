// "linear" and "linear_fused" on Kiln's own bf16 GEMMs (gemm_fma32.h, gemm_amx.h). The weight is read where
// it lies, or (AMX, prepacked) from a copy in the tile layout.
#include "backends/cpu/linear_own_gemm.h"

#include "backends/cpu/amx_packed_weights.h"
#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/gemm_fma32.h"
#include "backends/cpu/matmul_path.h"
#include "kiln/core/error.h"

namespace kiln::cpu_kernels {

namespace {

Bf16Gemm operands(const Tensor& x, const Tensor& w) {
  Bf16Gemm g;
  g.x = x.raw_data();
  g.x_row_stride = x.stride(0);
  g.x_col_stride = x.stride(1);
  g.w = w.raw_data();
  g.w_row_stride = w.stride(0);
  g.w_col_stride = w.stride(1);
  g.m = x.size(0);
  g.k = x.size(1);
  g.n = w.size(0);
  return g;
}

}  // namespace

OwnGemm own_gemm_for(const Tensor& x, const Tensor& w) {
  if (w.dtype() != bfloat16 || x.dtype() != bfloat16) return OwnGemm::None;
  switch (bf16_path()) {
    case Bf16Path::Fma32:
      return x.size(0) >= kFma32MinRows || bf16_path_forced() ? OwnGemm::Fma32 : OwnGemm::None;
    case Bf16Path::Amx:
      if (x.size(0) < kAmxMinRows && !bf16_path_forced()) return OwnGemm::None;
      return gemm_amx_takes(operands(x, w)) ? OwnGemm::Amx : OwnGemm::None;
    case Bf16Path::Onednn:
      break;
  }
  return OwnGemm::None;
}

void linear_own_gemm(OwnGemm gemm, const Tensor& x, const Tensor& w, const Tensor* bias, Activation act,
                     const Tensor* gate, const Tensor* residual, bool add_output, bool prepack,
                     const Tensor& out) {
  KILN_CHECK(gemm != OwnGemm::None, "linear: internal: no GEMM chosen");
  Bf16Gemm g = operands(x, w);
  if (gemm == OwnGemm::Amx && prepack) g.w_amx_tiles = amx_packed_weight(w);
  g.out = out.raw_data();
  g.out_dtype = out.dtype();
  g.out_row_stride = out.stride(0);
  LinearEpilogueArgs& e = g.epilogue;
  e.m = g.m;
  e.act = act;
  e.add_output = add_output;
  if (bias != nullptr) {
    e.bias = bias->raw_data();
    e.bias_dtype = bias->dtype();
  }
  if (gate != nullptr) {
    KILN_CHECK(gate->size(1) == 1 || gate->stride(1) == 1,
               "linear_fused: internal: gate " << shape_str(gate->shape()) << " has strided columns");
    e.gate = gate->raw_data();
    e.gate_dtype = gate->dtype();
    e.gate_rows = gate->size(0);
    e.gate_cols = gate->size(1);
    e.gate_row_stride = gate->stride(0);
  }
  if (residual != nullptr) {
    e.residual = residual->raw_data();
    e.residual_dtype = residual->dtype();
    e.residual_row_stride = residual->stride(0);
  }
  if (gemm == OwnGemm::Amx)
    gemm_amx(g);
  else
    gemm_fma32(g, use_avx512());
}

}  // namespace kiln::cpu_kernels
