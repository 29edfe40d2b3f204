// "linear_quantized": x [M, K] (float32 or bfloat16, contiguous) times a quantized weight [N, K] (GGUF blocks
// or fp8 bytes: uint8 [N, row_bytes], attr "type" = its quant::StorageType), optional bias [N] -> out [M, N]
// dense.
//
// The weight is expanded one panel of output rows at a time into a scratch buffer in x's dtype and handed to
// oneDNN's matmul as a transposed ("ba") operand, writing the panel's columns of the output in place. The
// scratch is reused across panels, so the resident weight stays quantized. Panels of about kPanelBytes keep
// the re-reads of x (once per panel) and oneDNN's per-call overheads small: on this host (2 Zen 4 cores,
// bf16, M = 1536, K = 3072) 128-row panels cost 15-25% over bf16's own product, 1024-row ones 0-10%, whole
// weights no less. Reordering each panel into oneDNN's blocked layout (bf16 weights' 10-13% gain when packed
// once) measured no faster: the reorder costs what it gains. Dequantization runs the per-ISA kernels
// (AVX-512 or portable) through kiln::quant::dequantize_row.
// A bf16 panel is multiplied on the host's bf16 path as a dense bf16 weight would be (matmul_path.h): Kiln's
// f32-FMA GEMM where f32 FMAs outrun vdpbf16ps, its AMX GEMM on AMX hosts, oneDNN otherwise; the panel is
// then a bf16 weight like any other, so the product's bits are the dense weight's on that path. Those GEMMs
// get panels of kOwnGemmPanelRows: with a third of that (384 x 2 columns, one block per thread) the fma32
// GEMM ran at 89-91% of the f32 FMA ceiling on Zen 5 (x re-read from memory for every panel, fewer work items
// to share), with 1536 rows at 93-94%, as with the whole dense weight (bench_matmul quantized).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/isa_dispatch.h"
#include "backends/cpu/linear_own_gemm.h"
#include "backends/cpu/onednn_util.h"
#include "backends/cpu/register_kernels.h"
#include "kiln/quant/storage_type.h"

namespace kiln::cpu_kernels {

KILN_ISA_DECLARE(void, quantized_matvec,
                 (quant::StorageType, const uint8_t*, int64_t, int64_t, const float*, int64_t, int64_t, bool,
                  const float*, void*, bool));

namespace {

using dnnl::memory;
using Md = memory::desc;

constexpr int64_t kPanelBytes = 6 << 20;
// Up to this many rows of x, the product reads each weight row once and dots it with every row of x
// (isa/quantized_matvec.cpp): 1 x 3072 x 18432 in Q8_0 took 5x bf16's time through the GEMM path, which
// writes and re-reads the expanded weight.
constexpr int64_t kMatvecMaxRows = 4;
constexpr int64_t kOwnGemmPanelRows = 1536;

// A dense float32 or bfloat16 tensor's values as float32.
void widen_to_f32(const Tensor& t, float* dst) {
  const int64_t n = t.numel();
  if (t.dtype() == float32) {
    std::memcpy(dst, t.raw_data(), static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* src = static_cast<const bf16_t*>(t.raw_data());
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

void matvec(const runtime::OpCall& call, quant::StorageType type) {
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const Tensor& out = call.outputs[0];
  const int64_t m = x.size(0), k = x.size(1), n = out.size(1);
  // Kernels compute and never dispatch, so x and the bias are widened here (a few rows; cheap).
  std::vector<float> xf(static_cast<size_t>(m * k)),
      bias(static_cast<size_t>(call.inputs.size() > 2 ? n : 0));
  widen_to_f32(x, xf.data());
  if (!bias.empty()) widen_to_f32(call.inputs[2], bias.data());
  KILN_ISA_CALL(quantized_matvec)
  (type, static_cast<const uint8_t*>(w.raw_data()), w.stride(0), n, xf.data(), m, k, x.dtype() == bfloat16,
   bias.empty() ? nullptr : bias.data(), out.raw_data(), out.dtype() == bfloat16);
}

template <class T>
void dequantize_panel(quant::StorageType type, const uint8_t* blocks, int64_t row_bytes, int64_t rows,
                      int64_t k, T* dst) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) quant::dequantize_row(type, blocks + r * row_bytes, dst + r * k, k);
}

void linear_quantized_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const Tensor* bias = call.inputs.size() > 2 ? &call.inputs[2] : nullptr;
  const Tensor& out = call.outputs[0];
  const auto type = static_cast<quant::StorageType>(call.attrs.get_int("type"));
  const int64_t m = x.size(0), k = x.size(1), n = out.size(1);
  if (m <= kMatvecMaxRows) return matvec(call, type);
  const DType ct = x.dtype();
  const memory::data_type dt = onednn::data_type(ct, "linear_quantized");
  // A multiple of 64 rows between 256 and 2048.
  const int64_t rows = kPanelBytes / (k * static_cast<int64_t>(dtype_size(ct))) / 64 * 64;
  int64_t panel = std::min(n, std::clamp<int64_t>(rows, 256, 2048));
  Tensor scratch = Tensor::empty({panel, k}, ct);
  const OwnGemm gemm = own_gemm_for(x, scratch);
  if (gemm != OwnGemm::None && panel < std::min(n, kOwnGemmPanelRows)) {
    panel = std::min(n, kOwnGemmPanelRows);
    scratch = Tensor::empty({panel, k}, ct);
  }
  const auto* blocks = static_cast<const uint8_t*>(w.raw_data());

  for (int64_t n0 = 0; n0 < n; n0 += panel) {
    const int64_t np = std::min(panel, n - n0);
    const uint8_t* src_rows = blocks + n0 * w.stride(0);
    if (ct == bfloat16)
      dequantize_panel(type, src_rows, w.stride(0), np, k, static_cast<bf16_t*>(scratch.raw_data()));
    else
      dequantize_panel(type, src_rows, w.stride(0), np, k, static_cast<float*>(scratch.raw_data()));

    if (gemm != OwnGemm::None) {
      const Tensor panel_w = scratch.slice(0, 0, np);
      const Tensor panel_bias = bias != nullptr ? bias->slice(0, n0, n0 + np) : Tensor();
      linear_own_gemm(gemm, x, panel_w, bias != nullptr ? &panel_bias : nullptr, Activation::None, nullptr,
                      nullptr, /*add_output=*/false, /*prepack=*/false, out.slice(1, n0, n0 + np));
      continue;
    }

    const Md src_md = onednn::dense_desc({m, k}, dt);
    const Md w_md = onednn::plain_desc({k, np}, {1, k}, ct, "linear_quantized");
    const Md dst_md = onednn::plain_desc({m, np}, {n, 1}, ct, "linear_quantized");
    Md bias_md;
    if (bias != nullptr) bias_md = onednn::plain_desc({1, np}, {n, 1}, bias->dtype(), "linear_quantized");
    onednn::KeyBuilder key("linear_quantized");
    key.add(src_md).add(w_md).add(dst_md);
    if (bias != nullptr) key.add(bias_md);
    auto cached = onednn::PrimitiveCache<dnnl::matmul>::get(key.str(), [&] {
      const dnnl::matmul::desc desc = bias != nullptr ? dnnl::matmul::desc(src_md, w_md, bias_md, dst_md)
                                                      : dnnl::matmul::desc(src_md, w_md, dst_md);
      return dnnl::matmul::primitive_desc(desc, onednn::default_attr(), onednn::engine());
    });
    const size_t esize = dtype_size(ct);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, memory(src_md, onednn::engine(), x.raw_data())},
        {DNNL_ARG_WEIGHTS, memory(w_md, onednn::engine(), scratch.raw_data())},
        {DNNL_ARG_DST, memory(dst_md, onednn::engine(), static_cast<char*>(out.raw_data()) + n0 * esize)}};
    if (bias != nullptr)
      args.insert({DNNL_ARG_BIAS, memory(bias_md, onednn::engine(),
                                         static_cast<char*>(bias->raw_data()) + n0 * bias->element_size())});
    onednn::execute(cached->primitive, cached->pd, std::move(args));
  }
}

}  // namespace

void register_quantized_linear_kernels(runtime::KernelRegistry& registry) {
  registry.add("linear_quantized", DeviceType::CPU, linear_quantized_kernel);
}

}  // namespace kiln::cpu_kernels
