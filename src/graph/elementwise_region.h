// The IR of a fusable elementwise region: a DAG of unary/binary/clamp/cast nodes over strided inputs and
// run-time scalars, producing one or more contiguous outputs of one shape. It is what the lazy-graph flush
// hands to the CPU JIT (graph/cpu_jit.h).
//
// Numerics follow the unfused kernels exactly: every value is computed in float32 and rounded (RNE) to its
// node's dtype, so a bfloat16 intermediate is rounded to bfloat16 just as the unfused op would round it
// when writing its output tensor. Fused and unfused results are then equal bit for bit.
//
// Scalars (a timestep, sigma, a clamp bound) are arguments of the kernel, never part of its code or of the
// structural key: only their count and the dtype they are rounded to before use are.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "runtime/elementwise_op.h"

namespace kiln::graph {

// The region's ops are the runtime's elementwise ops: one enum for them here, in the CPU kernels and in the
// op table.
using runtime::EwOp;

// What a node is: a leaf (an element of input `index`, or run-time scalar `index` rounded to the node's
// dtype and widened to float32), a rounding to the node's dtype with no math (the "copy" op between
// dtypes), or an elementwise op.
enum class FusedKind : uint8_t { Input, Scalar, Cast, Op };

// The ops a region holds (the CPU JIT generates code for each): these unary and binary ones, and clamp,
// whose bounds are values of the region (ElementwiseRegion::clamp).
bool fusable_unary(EwOp op);   // neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, silu, gelu, gelu_tanh,
                               // quick_gelu, square
bool fusable_binary(EwOp op);  // add, sub, mul, div, maximum, minimum

// A value of the region: the index of the node that defines it.
using ValueId = int32_t;

struct FusedNode {
  FusedKind kind;
  EwOp op;          // the op of a FusedKind::Op node (Add, unused, for the other kinds)
  DType dtype;      // float32, bfloat16 or float16: the result is rounded to it
  ValueId args[3];  // operands (-1 when unused); for Clamp: x, lo, hi
  int32_t index;    // Input: input number; Scalar: scalar number; else -1
};

// The node's name in structural keys and messages: "input", "scalar", "cast" or its op's ("gelu_tanh").
std::string_view fused_node_name(const FusedNode& n);

struct FusedInput {
  DType dtype;
  Strides strides;  // elements, one per dim of the region's shape; 0 broadcasts
};

struct FusedOutput {
  ValueId value;
  DType dtype;  // the stored value is rounded once more to this dtype (usually the node's own)
};

class ElementwiseRegion {
 public:
  // All outputs have `shape` and are contiguous.
  explicit ElementwiseRegion(Shape shape);

  // An input read with the given element strides over the region's shape (0 where it broadcasts).
  ValueId input(DType dtype, Strides strides);
  // An input laid out like `t` broadcast to the region's shape (t's shape must broadcast to it).
  ValueId input_like(DType dtype, const Shape& shape, const Strides& strides);
  // Run-time scalar number `scalar_count()`. `round_to` is the dtype the unfused op rounds the scalar to
  // before computing: bfloat16 for add/sub on bfloat16 tensors, float32 for mul/div and clamp bounds.
  ValueId scalar(DType round_to = float32);
  ValueId unary(EwOp op, ValueId x, DType dtype);                 // op: fusable_unary
  ValueId binary(EwOp op, ValueId a, ValueId b, DType dtype);     // op: fusable_binary
  ValueId clamp(ValueId x, ValueId lo, ValueId hi, DType dtype);  // lo/hi may be -1 (absent)
  ValueId cast(ValueId x, DType dtype);
  void output(ValueId value, DType dtype);
  void output(ValueId value);  // in the value's own dtype

  const Shape& shape() const { return shape_; }
  const std::vector<FusedInput>& inputs() const { return inputs_; }
  const std::vector<FusedNode>& nodes() const { return nodes_; }
  const std::vector<FusedOutput>& outputs() const { return outputs_; }
  int scalar_count() const { return static_cast<int>(scalar_dtypes_.size()); }
  const std::vector<DType>& scalar_dtypes() const { return scalar_dtypes_; }
  const FusedNode& node(ValueId v) const;

  // The same region with dims merged where every input's layout allows it and size-1 dims dropped (at least
  // one dim is kept). Kernels are generated for, and keyed by, this form: [2, 64, 3072] contiguous and
  // [393216] share one kernel.
  ElementwiseRegion canonical() const;

  // Everything the generated code depends on, as text: op kinds, dtypes, the canonical shape and input
  // strides (which says what broadcasts), the node graph and the outputs. Not scalar values, not pointers.
  std::string structural_key() const;
  // 64-bit FNV-1a of structural_key().
  uint64_t structural_hash() const;

 private:
  ValueId add_node(FusedNode node, std::string_view what);
  void check_value(ValueId v, std::string_view what) const;

  Shape shape_;
  std::vector<FusedInput> inputs_;
  std::vector<DType> scalar_dtypes_;
  std::vector<FusedNode> nodes_;
  std::vector<FusedOutput> outputs_;
};

// 64-bit FNV-1a, also used for cache keys and checksums of cached kernels.
uint64_t fnv1a64(const void* data, size_t size, uint64_t seed = 0xcbf29ce484222325ull);
std::string hex64(uint64_t v);

}  // namespace kiln::graph
