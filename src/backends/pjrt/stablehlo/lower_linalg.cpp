// Lowerings of matmul, linear and conv2d (src/backends/cpu/matmul.cpp, conv.cpp): products accumulate in
// float32 (16-bit operands are multiplied exactly and summed in float32, as oneDNN does), the bias is added
// in float32, and the result is rounded once to the output dtype.
#include "backends/pjrt/stablehlo/lower_products.h"
#include "backends/pjrt/stablehlo/lowering_math.h"
#include "backends/pjrt/stablehlo/lowering_registry.h"
#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {

DType accumulator_dtype(DType operands) {
  return operands == DType::Float64 ? DType::Float64 : DType::Float32;
}

Value linear_product(HloBuilder& b, const Value& x, const Value& w) {
  return b.dot_general(x, w, DotDims{{}, {}, {1}, {1}}, accumulator_dtype(x.dtype));
}

Value add_bias_f32(HloBuilder& b, const Value& acc, const Value& bias, int64_t dim) {
  return b.add(acc, b.broadcast_in_dim(b.convert(bias, acc.dtype), acc.shape, {dim}));
}

namespace {

// a [batch..., m, k] @ b [batch..., k, n] (same rank; size-1 batch dims broadcast) -> [batch..., m, n].
std::vector<Value> lower_matmul(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  const Shape& out = call.outputs[0].shape();
  const int64_t rank = static_cast<int64_t>(out.size());
  std::vector<int64_t> batch;
  for (int64_t d = 0; d + 2 < rank; ++d) batch.push_back(d);
  auto operand = [&](const Value& v) {
    Shape s = v.shape;
    for (int64_t d : batch) s[static_cast<size_t>(d)] = out[static_cast<size_t>(d)];
    return b.broadcast_to(v, s);
  };
  const Value acc =
      b.dot_general(operand(in[0]), operand(in[1]), DotDims{batch, batch, {rank - 1}, {rank - 2}},
                    accumulator_dtype(in[0].dtype));
  return {b.convert(acc, call.outputs[0].dtype())};
}

// x [m, k], weight [n, k], optional bias [n] (x's dtype or float32; absent from the inputs when undefined).
std::vector<Value> lower_linear(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  Value acc = linear_product(b, in[0], in[1]);
  if (in.size() > 2) acc = add_bias_f32(b, acc, in[2], 1);
  return {b.convert(acc, call.outputs[0].dtype())};
}

// x [N, C, H, W], weight [O, C / groups, kh, kw], optional bias [O]; attrs stride, padding, dilation, groups.
std::vector<Value> lower_conv2d(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  const auto& stride = call.attrs.get_ints("stride");
  const auto& padding = call.attrs.get_ints("padding");
  const ConvParams params{stride,
                          {{padding[0], padding[0]}, {padding[1], padding[1]}},
                          call.attrs.get_ints("dilation"),
                          call.attrs.get_int("groups")};
  Value acc = b.convolution(in[0], in[1], params, accumulator_dtype(in[0].dtype));
  if (in.size() > 2) acc = add_bias_f32(b, acc, in[2], 1);
  return {b.convert(acc, call.outputs[0].dtype())};
}

}  // namespace

void add_linalg_lowerings(LoweringTable& t) {
  t.push_back({"matmul", lower_matmul});
  t.push_back({"linear", lower_linear});
  t.push_back({"conv2d", lower_conv2d});
}

}  // namespace kiln::pjrt::hlo
