// "linear_quantized": x [M, K] (float32 or bfloat16, contiguous) times a block-quantized weight [N, K]
// (uint8 blocks [N, row_bytes], attr "type" = ggml type id), optional bias [N] -> out [M, N] dense.
//
// The weight is expanded one panel of output rows at a time into a scratch buffer in x's dtype and handed to
// oneDNN's matmul as a transposed ("ba") operand, writing the panel's columns of the output in place. The
// scratch is reused across panels, so the resident weight stays quantized; a panel of kPanelRows rows keeps
// the re-reads of x (once per panel) small next to the GEMM's own traffic. Dequantization runs the per-ISA
// kernels (AVX-512 or portable) through kiln::quant::dequantize_row.
#include <algorithm>

#include "backends/cpu/onednn_util.h"
#include "backends/cpu/register_kernels.h"
#include "kiln/quant/ggml_type.h"

namespace kiln::cpu_kernels {

namespace {

using dnnl::memory;
using Md = memory::desc;

constexpr int64_t kPanelRows = 512;

template <class T>
void dequantize_panel(quant::GgmlType type, const uint8_t* blocks, int64_t row_bytes, int64_t rows, int64_t k,
                      T* dst) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) quant::dequantize_row(type, blocks + r * row_bytes, dst + r * k, k);
}

void linear_quantized_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const Tensor* bias = call.inputs.size() > 2 ? &call.inputs[2] : nullptr;
  const Tensor& out = call.outputs[0];
  const auto type = static_cast<quant::GgmlType>(call.attrs.get_int("type"));
  const int64_t m = x.size(0), k = x.size(1), n = out.size(1);
  const DType ct = x.dtype();
  const memory::data_type dt = onednn::data_type(ct, "linear_quantized");
  const int64_t panel = std::min(n, kPanelRows);
  Tensor scratch = Tensor::empty({panel, k}, ct);
  const auto* blocks = static_cast<const uint8_t*>(w.raw_data());

  for (int64_t n0 = 0; n0 < n; n0 += panel) {
    const int64_t np = std::min(panel, n - n0);
    const uint8_t* src_rows = blocks + n0 * w.stride(0);
    if (ct == bfloat16)
      dequantize_panel(type, src_rows, w.stride(0), np, k, static_cast<bf16_t*>(scratch.raw_data()));
    else
      dequantize_panel(type, src_rows, w.stride(0), np, k, static_cast<float*>(scratch.raw_data()));

    const Md src_md = onednn::dense_desc({m, k}, dt);
    const Md w_md = onednn::plain_desc({k, np}, {1, k}, ct, "linear_quantized");
    const Md dst_md = onednn::plain_desc({m, np}, {n, 1}, ct, "linear_quantized");
    Md bias_md;
    if (bias != nullptr)
      bias_md = onednn::plain_desc({1, np}, {n, 1}, bias->dtype(), "linear_quantized");
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
