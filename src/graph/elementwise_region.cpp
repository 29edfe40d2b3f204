#include "graph/elementwise_region.h"

#include <cstdio>
#include <sstream>

#include "kiln/core/error.h"

namespace kiln::graph {

namespace {

constexpr const char* kOp = "fused_elementwise";

bool is_float_dtype(DType d) {
  return d == float32 || d == bfloat16 || d == float16;
}

const char* short_dtype(DType d) {
  switch (d) {
    case DType::Float32:
      return "f32";
    case DType::BFloat16:
      return "bf16";
    case DType::Float16:
      return "f16";
    default:
      return "?";
  }
}

void check_dtype(DType d, std::string_view what) {
  KILN_CHECK(is_float_dtype(d),
             kOp << ": " << what << " must be float32, bfloat16 or float16, got " << dtype_name(d));
}

}  // namespace

bool fusable_unary(EwOp op) {
  switch (op) {
    case EwOp::Neg:
    case EwOp::Abs:
    case EwOp::Exp:
    case EwOp::Log:
    case EwOp::Sqrt:
    case EwOp::Rsqrt:
    case EwOp::Tanh:
    case EwOp::Sigmoid:
    case EwOp::Silu:
    case EwOp::Gelu:
    case EwOp::GeluTanh:
    case EwOp::QuickGelu:
    case EwOp::Square:
      return true;
    default:
      return false;
  }
}

bool fusable_binary(EwOp op) {
  return op >= EwOp::Add && op <= EwOp::Minimum;
}

std::string_view fused_node_name(const FusedNode& n) {
  switch (n.kind) {
    case FusedKind::Input:
      return "input";
    case FusedKind::Scalar:
      return "scalar";
    case FusedKind::Cast:
      return "cast";
    case FusedKind::Op:
      break;
  }
  return runtime::ew_op_name(n.op);
}

ElementwiseRegion::ElementwiseRegion(Shape shape) : shape_(std::move(shape)) {
  for (int64_t d : shape_)
    KILN_CHECK(d >= 0, kOp << ": expected a non-negative shape, got " << shape_str(shape_));
}

ValueId ElementwiseRegion::add_node(FusedNode node, std::string_view what) {
  check_dtype(node.dtype, what);
  nodes_.push_back(node);
  return static_cast<ValueId>(nodes_.size() - 1);
}

void ElementwiseRegion::check_value(ValueId v, std::string_view what) const {
  KILN_CHECK(v >= 0 && static_cast<size_t>(v) < nodes_.size(), kOp << ": " << what << " refers to value " << v
                                                                   << ", but the region has " << nodes_.size()
                                                                   << " values");
}

const FusedNode& ElementwiseRegion::node(ValueId v) const {
  check_value(v, "node()");
  return nodes_[static_cast<size_t>(v)];
}

ValueId ElementwiseRegion::input(DType dtype, Strides strides) {
  check_dtype(dtype, "an input");
  KILN_CHECK(strides.size() == shape_.size(), kOp << ": input strides " << shape_str(strides)
                                                  << " do not match the rank of shape " << shape_str(shape_));
  for (int64_t s : strides)
    KILN_CHECK(s >= 0, kOp << ": expected non-negative input strides, got " << shape_str(strides));
  inputs_.push_back(FusedInput{dtype, std::move(strides)});
  return add_node(
      FusedNode{FusedKind::Input, EwOp::Add, dtype, {-1, -1, -1}, static_cast<int32_t>(inputs_.size() - 1)},
      "an input");
}

ValueId ElementwiseRegion::input_like(DType dtype, const Shape& shape, const Strides& strides) {
  KILN_CHECK(
      shape.size() == strides.size() && shape.size() <= shape_.size(),
      kOp << ": input of shape " << shape_str(shape) << " does not broadcast to " << shape_str(shape_));
  Strides out(shape_.size(), 0);
  const size_t lead = shape_.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t want = shape_[lead + d];
    KILN_CHECK(shape[d] == want || shape[d] == 1, kOp << ": input of shape " << shape_str(shape)
                                                      << " does not broadcast to " << shape_str(shape_));
    out[lead + d] = shape[d] == want && want != 1 ? strides[d] : 0;
  }
  return input(dtype, std::move(out));
}

ValueId ElementwiseRegion::scalar(DType round_to) {
  check_dtype(round_to, "a scalar's dtype");
  scalar_dtypes_.push_back(round_to);
  return add_node(FusedNode{FusedKind::Scalar,
                            EwOp::Add,
                            round_to,
                            {-1, -1, -1},
                            static_cast<int32_t>(scalar_dtypes_.size() - 1)},
                  "a scalar");
}

ValueId ElementwiseRegion::unary(EwOp op, ValueId x, DType dtype) {
  const std::string_view name = runtime::ew_op_name(op);
  KILN_CHECK(fusable_unary(op), kOp << ": " << name << " is not a unary op a region holds");
  check_value(x, name);
  return add_node(FusedNode{FusedKind::Op, op, dtype, {x, -1, -1}, -1}, name);
}

ValueId ElementwiseRegion::binary(EwOp op, ValueId a, ValueId b, DType dtype) {
  const std::string_view name = runtime::ew_op_name(op);
  KILN_CHECK(fusable_binary(op), kOp << ": " << name << " is not a binary op a region holds");
  check_value(a, name);
  check_value(b, name);
  return add_node(FusedNode{FusedKind::Op, op, dtype, {a, b, -1}, -1}, name);
}

ValueId ElementwiseRegion::clamp(ValueId x, ValueId lo, ValueId hi, DType dtype) {
  check_value(x, "clamp");
  KILN_CHECK(lo >= 0 || hi >= 0, kOp << ": clamp needs at least one of lo and hi");
  if (lo >= 0) check_value(lo, "clamp's lo");
  if (hi >= 0) check_value(hi, "clamp's hi");
  return add_node(FusedNode{FusedKind::Op, EwOp::Clamp, dtype, {x, lo, hi}, -1}, "clamp");
}

ValueId ElementwiseRegion::cast(ValueId x, DType dtype) {
  check_value(x, "cast");
  return add_node(FusedNode{FusedKind::Cast, EwOp::Add, dtype, {x, -1, -1}, -1}, "cast");
}

void ElementwiseRegion::output(ValueId value, DType dtype) {
  check_value(value, "an output");
  check_dtype(dtype, "an output");
  outputs_.push_back(FusedOutput{value, dtype});
}

void ElementwiseRegion::output(ValueId value) {
  output(value, node(value).dtype);
}

ElementwiseRegion ElementwiseRegion::canonical() const {
  // Walk dims from the innermost outwards, merging dim d into the current (inner) group when every input
  // steps over the group exactly as a contiguous tensor would (outputs are contiguous, so they always do).
  Shape shape;
  std::vector<Strides> strides(inputs_.size());
  for (int d = static_cast<int>(shape_.size()) - 1; d >= 0; --d) {
    const int64_t n = shape_[static_cast<size_t>(d)];
    if (n == 1) continue;
    bool merge = !shape.empty();
    for (size_t k = 0; merge && k < inputs_.size(); ++k)
      merge = inputs_[k].strides[static_cast<size_t>(d)] == strides[k].front() * shape.front();
    if (merge) {
      shape.front() *= n;
    } else {
      shape.insert(shape.begin(), n);
      for (size_t k = 0; k < inputs_.size(); ++k)
        strides[k].insert(strides[k].begin(), inputs_[k].strides[static_cast<size_t>(d)]);
    }
  }
  if (shape.empty() || shape_numel(shape_) == 0) {
    // A single element (or none): one dim; the empty case keeps a 0 so that the key records it.
    shape = {shape_numel(shape_)};
    for (auto& s : strides) s = {0};
  }
  // A broadcast group merged above keeps stride 0 only if all of its dims were 0; the merge test
  // (0 == 0 * n) guarantees that.
  ElementwiseRegion r(shape);
  r.inputs_ = inputs_;
  for (size_t k = 0; k < inputs_.size(); ++k) r.inputs_[k].strides = strides[k];
  r.scalar_dtypes_ = scalar_dtypes_;
  r.nodes_ = nodes_;
  r.outputs_ = outputs_;
  return r;
}

std::string ElementwiseRegion::structural_key() const {
  const ElementwiseRegion c = canonical();
  std::ostringstream s;
  s << "ew1;shape=";
  for (int64_t d : c.shape_) s << d << ',';
  for (size_t k = 0; k < c.inputs_.size(); ++k) {
    s << ";in" << k << '=' << short_dtype(c.inputs_[k].dtype) << '/';
    for (int64_t st : c.inputs_[k].strides) s << st << ',';
  }
  for (size_t k = 0; k < c.scalar_dtypes_.size(); ++k)
    s << ";s" << k << '=' << short_dtype(c.scalar_dtypes_[k]);
  for (size_t i = 0; i < c.nodes_.size(); ++i) {
    const FusedNode& n = c.nodes_[i];
    s << ";v" << i << '=' << fused_node_name(n) << ':' << short_dtype(n.dtype) << '(';
    if (n.index >= 0) s << '#' << n.index;
    for (ValueId a : n.args) s << ',' << a;
    s << ')';
  }
  for (const FusedOutput& o : c.outputs_) s << ";out=v" << o.value << ':' << short_dtype(o.dtype);
  return s.str();
}

uint64_t ElementwiseRegion::structural_hash() const {
  const std::string key = structural_key();
  return fnv1a64(key.data(), key.size());
}

uint64_t fnv1a64(const void* data, size_t size, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace kiln::graph
