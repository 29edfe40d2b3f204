// "conv2d" on oneDNN's convolution primitive: inputs x [N, C, H, W], weight [O, C/groups, kh, kw],
// optional bias [O] (x's dtype or float32); output [N, O, Ho, Wo] dense; attrs stride, padding, dilation
// (torch conventions), groups.
//
// With plain NCHW tensors oneDNN only offers its im2col+gemm convolution; with layouts left to it ("any")
// it picks brgconv with channel-blocked layouts, which is several times faster for the VAE's 3x3 convs and
// pays for reordering x and the output (a few bytes per element against thousands of FLOP per element).
// The weight is reordered once and cached on its Storage. float16 is computed in float32: the reorders
// convert on the way in and out.
#include "backends/cpu/onednn_util.h"
#include "backends/cpu/register_kernels.h"

namespace kiln::cpu_kernels {

namespace {

using dnnl::memory;
using Md = memory::desc;

// `t` in the layout `want`: in place when it already is, else reordered into `scratch`.
memory as_layout(const Tensor& t, const Md& have, const Md& want, Tensor& scratch) {
  memory src(have, onednn::engine(), t.raw_data());
  if (have == want) return src;
  scratch = Tensor::empty({static_cast<int64_t>(want.get_size())}, uint8);
  memory dst(want, onednn::engine(), scratch.raw_data());
  onednn::reorder(src, dst);
  return dst;
}

void conv2d_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const Tensor* bias = call.inputs.size() > 2 ? &call.inputs[2] : nullptr;
  const Tensor& out = call.outputs[0];
  const auto& stride = call.attrs.get_ints("stride");
  const auto& padding = call.attrs.get_ints("padding");
  const auto& dilation = call.attrs.get_ints("dilation");
  const int64_t groups = call.attrs.get_int("groups");
  const memory::data_type ct = x.dtype() == bfloat16 ? memory::data_type::bf16 : memory::data_type::f32;
  const auto any = memory::format_tag::any;

  const Md x_md = onednn::plain_desc(x, "conv2d");
  const Md out_md = onednn::plain_desc(out, "conv2d");
  Md w_plain;
  Shape w_dims;
  if (groups == 1) {
    w_dims = w.shape();
    w_plain = onednn::plain_desc(w, "conv2d");
  } else {
    const int64_t og = w.size(0) / groups;
    w_dims = {groups, og, w.size(1), w.size(2), w.size(3)};
    w_plain = onednn::plain_desc(
        w_dims, {og * w.stride(0), w.stride(0), w.stride(1), w.stride(2), w.stride(3)}, w.dtype(), "conv2d");
  }
  // oneDNN adds the bias in float32 whatever its type; a float16 bias has no oneDNN type here, so it is
  // converted (it is [O], tiny).
  Tensor bias_f32;
  Md b_md;
  if (bias != nullptr) {
    if (bias->dtype() == float16) {
      bias_f32 = Tensor::empty(bias->shape(), float32);
      memory to(onednn::dense_desc(bias->shape(), memory::data_type::f32), onednn::engine(),
                bias_f32.raw_data());
      onednn::reorder(memory(onednn::plain_desc(*bias, "conv2d"), onednn::engine(), bias->raw_data()), to);
    }
    b_md = onednn::plain_desc(bias_f32.defined() ? bias_f32 : *bias, "conv2d");
  }

  const Md src_any(x.shape(), ct, any), dst_any(out.shape(), ct, any);
  // oneDNN counts dilation from 0 (no dilation) where torch counts from 1.
  const memory::dims strides{stride[0], stride[1]}, dil{dilation[0] - 1, dilation[1] - 1},
      pad{padding[0], padding[1]};
  const auto primitive_for = [&](const Md& w_md) {
    onednn::KeyBuilder key("conv2d");
    key.add(x.shape()).add(w_dims).add(out.shape()).add(static_cast<int64_t>(ct)).add(stride).add(padding);
    key.add(dilation).add(groups).add(w_md);
    if (bias != nullptr) key.add(b_md);
    return onednn::PrimitiveCache<dnnl::convolution_forward>::get(key.str(), [&] {
      const auto desc = bias != nullptr
                            ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                              dnnl::algorithm::convolution_direct, src_any,
                                                              w_md, b_md, dst_any, strides, dil, pad, pad)
                            : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                              dnnl::algorithm::convolution_direct, src_any,
                                                              w_md, dst_any, strides, dil, pad, pad);
      return dnnl::convolution_forward::primitive_desc(desc, onednn::default_attr(), onednn::engine());
    });
  };
  // A weight already packed (by this conv at another image size) keeps its layout: one packed copy per weight
  // (see onednn::packed_layout). Unless oneDNN has only its reference convolution for this size in that
  // layout (the edge tiles of a tiled VAE decode, 256 x 128: minutes instead of a second): then the layout
  // is oneDNN's choice and the weight is reordered for this call.
  const std::optional<Md> packed_layout = onednn::packed_layout(w);
  auto cached = primitive_for(packed_layout ? *packed_layout : Md(w_dims, ct, any));
  if (packed_layout && onednn::is_reference_impl(cached->pd)) {
    auto chosen = primitive_for(Md(w_dims, ct, any));
    if (!onednn::is_reference_impl(chosen->pd)) cached = chosen;
  }
  const auto& pd = cached->pd;

  Tensor src_scratch, dst_scratch;
  const memory src = as_layout(x, x_md, pd.src_desc(), src_scratch);
  // Over the packed-weight budget, or in a layout other than the packed copy's, the weight is reordered for
  // this call only.
  Tensor weight_scratch;
  memory weights;
  std::optional<memory> packed;
  if (!packed_layout || *packed_layout == pd.weights_desc())
    packed = onednn::packed_weight(w, w_plain, pd.weights_desc());
  if (packed) {
    weights = *packed;
  } else {
    weight_scratch = Tensor::empty({static_cast<int64_t>(pd.weights_desc().get_size())}, uint8);
    weights = memory(pd.weights_desc(), onednn::engine(), weight_scratch.raw_data());
    onednn::reorder(memory(w_plain, onednn::engine(), w.raw_data()), weights);
  }
  const bool dst_direct = pd.dst_desc() == out_md;
  memory dst(pd.dst_desc(), onednn::engine(), out.raw_data());
  if (!dst_direct) {
    dst_scratch = Tensor::empty({static_cast<int64_t>(pd.dst_desc().get_size())}, uint8);
    dst = memory(pd.dst_desc(), onednn::engine(), dst_scratch.raw_data());
  }
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}};
  if (bias != nullptr) {
    const Tensor& b = bias_f32.defined() ? bias_f32 : *bias;
    args.insert({DNNL_ARG_BIAS, memory(b_md, onednn::engine(), b.raw_data())});
  }
  onednn::execute(cached->primitive, pd, std::move(args));
  if (!dst_direct) onednn::reorder(dst, memory(out_md, onednn::engine(), out.raw_data()));
}

}  // namespace

void register_conv_kernels(runtime::KernelRegistry& registry) {
  registry.add("conv2d", DeviceType::CPU, conv2d_kernel);
}

}  // namespace kiln::cpu_kernels
