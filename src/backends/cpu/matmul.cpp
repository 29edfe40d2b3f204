// "linear" and "matmul" on oneDNN's matmul primitive; "linear" with bf16 weights on Kiln's f32-FMA or AMX
// GEMM where that is this host's faster path (matmul_path.h, linear_own_gemm.h).
//  linear: inputs x [M, K], weight [N, K], optional bias [N] (output dtype or float32); output [M, N]
//          dense; attr "prepack" (bool).
//  matmul: inputs a [batch..., M, K], b [batch..., K, N] with equal ranks and batch dims equal or 1;
//          output [batch..., M, N] dense.
// The front end (src/ops/linalg.cpp) guarantees each operand's last two dims are row- or column-major.
#include "backends/cpu/linear_own_gemm.h"
#include "backends/cpu/onednn_util.h"
#include "backends/cpu/register_kernels.h"

namespace kiln::cpu_kernels {

namespace {

using dnnl::memory;
using Md = memory::desc;

using onednn::compute_type;
using onednn::Operand;
using onednn::operand;

// Output memory: the output itself, or a float32 buffer rounded into it afterwards (float16).
struct Result {
  Md desc;
  memory mem;
  Tensor buffer;
  const Tensor* out;

  explicit Result(const Tensor& t) : out(&t) {
    if (t.dtype() == float16) {
      buffer = Tensor::empty(t.shape(), float32);
      desc = onednn::dense_desc(t.shape(), memory::data_type::f32);
      mem = memory(desc, onednn::engine(), buffer.raw_data());
    } else {
      desc = onednn::dense_desc(t.shape(), onednn::data_type(t.dtype(), "matmul"));
      mem = memory(desc, onednn::engine(), t.raw_data());
    }
  }
  void finish() const {
    if (!buffer.defined()) return;
    memory dst(onednn::dense_desc(out->shape(), memory::data_type::f16), onednn::engine(), out->raw_data());
    onednn::reorder(mem, dst);
  }
};

void linear_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const Tensor* bias = call.inputs.size() > 2 ? &call.inputs[2] : nullptr;
  const Tensor& out = call.outputs[0];
  if (const OwnGemm gemm = own_gemm_for(x, w); gemm != OwnGemm::None)
    return linear_own_gemm(gemm, x, w, bias, Activation::None, nullptr, nullptr, false,
                           call.attrs.get_bool("prepack"), out);
  const int64_t k = x.size(1), n = w.size(0);
  const memory::data_type ct = compute_type(x.dtype());

  const Operand src = operand(x, "linear");
  // oneDNN's weights are [K, N]: the stored [N, K] weight is its transpose ("ba"), used as is or packed.
  const Md w_plain = onednn::plain_desc({k, n}, {w.stride(1), w.stride(0)}, w.dtype(), "linear");
  const bool pack = call.attrs.get_bool("prepack") || w.dtype() == float16;
  Operand b;
  if (bias != nullptr) b = operand(*bias, {1, n}, {n, 1}, "linear");
  const Result dst(out);

  const auto [cached, weights] = onednn::matmul_with_weight(
      w, w_plain, pack, ct,
      [&](const Md& w_md) {
        onednn::KeyBuilder key("linear");
        key.add(src.desc).add(w_md).add(dst.desc);
        if (bias != nullptr) key.add(b.desc);
        return key.str();
      },
      [&](const Md& w_md) {
        const dnnl::matmul::desc desc = bias != nullptr ? dnnl::matmul::desc(src.desc, w_md, b.desc, dst.desc)
                                                        : dnnl::matmul::desc(src.desc, w_md, dst.desc);
        return dnnl::matmul::primitive_desc(desc, onednn::default_attr(), onednn::engine());
      });
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src.mem}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst.mem}};
  if (bias != nullptr) args.insert({DNNL_ARG_BIAS, b.mem});
  onednn::execute(cached->primitive, cached->pd, std::move(args));
  dst.finish();
}

void matmul_kernel(const runtime::OpCall& call) {
  const Operand a = operand(call.inputs[0], "matmul");
  const Operand b = operand(call.inputs[1], "matmul");
  const Result dst(call.outputs[0]);
  const std::string key = onednn::KeyBuilder("matmul").add(a.desc).add(b.desc).add(dst.desc).str();
  auto cached = onednn::PrimitiveCache<dnnl::matmul>::get(key, [&] {
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a.desc, b.desc, dst.desc), onednn::default_attr(),
                                        onednn::engine());
  });
  onednn::execute(cached->primitive, cached->pd,
                  {{DNNL_ARG_SRC, a.mem}, {DNNL_ARG_WEIGHTS, b.mem}, {DNNL_ARG_DST, dst.mem}});
  dst.finish();
}

}  // namespace

void register_matmul_kernels(runtime::KernelRegistry& registry) {
  registry.add("linear", DeviceType::CPU, linear_kernel);
  registry.add("matmul", DeviceType::CPU, matmul_kernel);
}

}  // namespace kiln::cpu_kernels
