// HloBuilder: writes one StableHLO module as MLIR text, op by op, for a PJRT plugin to compile.
//
// Every op is written in MLIR's *generic* form (`%3 = "stablehlo.add"(%1, %2) : (tensor<2xf32>,
// tensor<2xf32>)
// -> tensor<2xf32>`, inherent attributes in `<{...}>`), which the StableHLO of jaxlib 0.11.2's XLA (the
// pinned CPU plugin, lammps-jax-pjrt-cpu 0.11.2) and the CUDA plugin of the same XLA parse; StableHLO's
// pretty form changes between versions, the generic one much less. The text is deterministic (values are
// numbered in the order they are made), so it doubles as a compile-cache key.
//
// Values carry their tensor type and every method checks its operands' shapes and dtypes, throwing a
// kiln::Error naming the op and what was expected, so a lowering bug is reported here rather than as a plugin
// parse error (or a plugin abort). Nothing is broadcast implicitly: broadcast_to / the *_bcast helpers make
// it explicit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/pjrt/stablehlo/lowering_target.h"
#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"

namespace kiln::pjrt::hlo {

// "tensor<2x3xf32>", "tensor<bf16>" (rank 0), "tensor<0x4xi1>" (bool is i1, uint8 is ui8).
std::string tensor_type(DType dtype, const Shape& shape);
// "f32", "bf16", "f16", "f64", "i64", "i32", "i16", "i8", "ui8", "i1".
std::string_view element_type(DType dtype);

// An SSA value of the module being built: its number and its tensor type. Plain data: copy it freely. A Value
// is only meaningful to the builder that made it.
struct Value {
  int64_t id = -1;  // -1: no value (an undefined optional input)
  DType dtype = DType::Float32;
  Shape shape;

  bool defined() const { return id >= 0; }
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const { return shape_numel(shape); }
};

enum class Compare { EQ, NE, LT, LE, GT, GE };
enum class ReduceKind { Sum, Max, Min };

// dot_general's dimension numbers (StableHLO's DotDimensionNumbers). The result's dims are the batch dims,
// then lhs's free dims, then rhs's free dims, each in order.
struct DotDims {
  std::vector<int64_t> lhs_batch, rhs_batch, lhs_contract, rhs_contract;
};

// A 2-D (or N-D) convolution in NCHW / OIHW / NCHW layout (what Kiln's conv2d uses).
struct ConvParams {
  std::vector<int64_t> strides;                  // per spatial dim
  std::vector<std::pair<int64_t, int64_t>> pad;  // (low, high) per spatial dim
  std::vector<int64_t> dilation;                 // rhs (kernel) dilation per spatial dim
  int64_t groups = 1;                            // feature_group_count
};

// gather's dimension numbers (StableHLO's GatherDimensionNumbers; no batching dims).
struct GatherDims {
  std::vector<int64_t> offset_dims, collapsed_slice_dims, start_index_map;
  int64_t index_vector_dim = 0;
};

// scatter's dimension numbers (StableHLO's ScatterDimensionNumbers; no batching dims).
struct ScatterDims {
  std::vector<int64_t> update_window_dims, inserted_window_dims, scatter_dims_to_operand_dims;
  int64_t index_vector_dim = 0;
};

class HloBuilder {
 public:
  // `module_name` names the module (`module @kiln_add`); letters, digits and '_' only. `target` is the
  // platform the module is for (lowerings that differ per platform ask target()).
  explicit HloBuilder(std::string module_name = "kiln", LoweringTarget target = {});

  const LoweringTarget& target() const { return target_; }

  // A new argument of @main, in order (%arg0, %arg1, ...).
  Value parameter(DType dtype, const Shape& shape);
  int64_t num_parameters() const { return static_cast<int64_t>(params_.size()); }

  // The whole module, @main returning `results` in order. May be called more than once.
  std::string module_text(const std::vector<Value>& results) const;

  // --- constants ---
  // A tensor of `shape` whose elements all equal `value`, rounded to `dtype` (bool: value != 0). Non-finite
  // floats are written as hex bit patterns (MLIR has no literal for them).
  Value splat(double value, DType dtype, const Shape& shape = {});
  Value scalar(double value, DType dtype) { return splat(value, dtype, {}); }
  // An op's scalar argument (an elementwise op's "scalar" attr: a scheduler's step size, a sigma) as a tensor
  // of `shape`: a splat constant, or, once lift_scalars() was called, a new rank-0 parameter broadcast to
  // `shape`, its value recorded in lifted_scalars(). Lifted, a value that changes between launches leaves
  // the text (the executable caches' key) unchanged: deferred-and-fused regions compile once, not per step.
  Value scalar_operand(double value, DType dtype, const Shape& shape);
  void lift_scalars() { lift_scalars_ = true; }
  struct LiftedScalar {
    int64_t parameter;  // its @main argument number
    double value;       // already rounded as scalar_operand's caller wants it
    DType dtype;
  };
  const std::vector<LiftedScalar>& lifted_scalars() const { return lifted_; }
  // A dense integer tensor (dtype Int64 or Int32) of `shape` holding `values` in row-major order.
  Value constant_ints(const std::vector<int64_t>& values, DType dtype, const Shape& shape);
  // iota along `dim` of a tensor of `shape`: element = its index along `dim`.
  Value iota(DType dtype, const Shape& shape, int64_t dim);

  // --- elementwise (operands of one type; the result has it) ---
  // `op` is the StableHLO op name without its dialect ("exponential", "add", ...), or a full name with its
  // dialect for the few CHLO ops XLA accepts and legalizes itself ("chlo.erf").
  Value unary(std::string_view op, const Value& x);
  Value binary(std::string_view op, const Value& a, const Value& b);
  Value neg(const Value& x) { return unary("negate", x); }
  Value abs(const Value& x) { return unary("abs", x); }
  Value exp(const Value& x) { return unary("exponential", x); }
  Value log(const Value& x) { return unary("log", x); }
  Value sqrt(const Value& x) { return unary("sqrt", x); }
  Value rsqrt(const Value& x) { return unary("rsqrt", x); }
  Value sin(const Value& x) { return unary("sine", x); }
  Value cos(const Value& x) { return unary("cosine", x); }
  Value tanh(const Value& x) { return unary("tanh", x); }
  Value logistic(const Value& x) { return unary("logistic", x); }
  Value floor(const Value& x) { return unary("floor", x); }
  Value erf(const Value& x) { return unary("chlo.erf", x); }  // StableHLO has no erf; JAX emits chlo.erf too
  Value add(const Value& a, const Value& b) { return binary("add", a, b); }
  Value sub(const Value& a, const Value& b) { return binary("subtract", a, b); }
  Value mul(const Value& a, const Value& b) { return binary("multiply", a, b); }
  Value div(const Value& a, const Value& b) { return binary("divide", a, b); }
  Value max(const Value& a, const Value& b) { return binary("maximum", a, b); }
  Value min(const Value& a, const Value& b) { return binary("minimum", a, b); }
  Value pow(const Value& a, const Value& b) { return binary("power", a, b); }
  Value logical_and(const Value& a, const Value& b) { return binary("and", a, b); }
  Value logical_or(const Value& a, const Value& b) { return binary("or", a, b); }
  // The same, with a and b first broadcast to their common (numpy) shape.
  Value binary_bcast(std::string_view op, const Value& a, const Value& b);
  // a `cmp` b (same type) → bool of their shape. Floats compare as IEEE (NaN unordered); bool and uint8
  // unsigned.
  Value compare(Compare cmp, const Value& a, const Value& b);
  // pred ? on_true : on_false, elementwise; pred is bool of the operands' shape (or a bool scalar).
  Value select(const Value& pred, const Value& on_true, const Value& on_false);
  // Element type conversion (float→int truncates toward zero; x→bool is x != 0). Returns x itself when the
  // dtype already matches, so lowerings can convert unconditionally.
  Value convert(const Value& x, DType dtype);

  // --- shapes ---
  // x's dim i becomes result dim dims[i]; every other result dim is broadcast. x's dim i must be 1 or
  // shape[dims[i]].
  Value broadcast_in_dim(const Value& x, const Shape& shape, const std::vector<int64_t>& dims);
  // numpy broadcasting of x to `shape` (x's dims aligned to the right). Returns x when the shapes already
  // match.
  Value broadcast_to(const Value& x, const Shape& shape);
  // Same element count, row-major order. Returns x when the shape already matches.
  Value reshape(const Value& x, const Shape& shape);
  // result dim i is x's dim perm[i]. Returns x for the identity permutation.
  Value transpose(const Value& x, const std::vector<int64_t>& perm);
  // Static slice [start, limit) with `strides` (all 1 when empty).
  Value slice(const Value& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
              const std::vector<int64_t>& strides = {});
  // Slice of one dim: [start, limit) along `dim`.
  Value slice_dim(const Value& x, int64_t dim, int64_t start, int64_t limit);
  Value concatenate(const std::vector<Value>& xs, int64_t dim);
  // x with `low` / `high` elements of `pad_value` (a scalar of x's dtype) added before / after each dim.
  Value pad(const Value& x, const Value& pad_value, const std::vector<int64_t>& low,
            const std::vector<int64_t>& high);

  // --- reductions ---
  // Reduces x over `dims` (sorted, unique) with sum / max / min; those dims are removed from the shape. The
  // init value is 0 / -inf / +inf (the dtype's lowest / highest for integers).
  Value reduce(const Value& x, const std::vector<int64_t>& dims, ReduceKind kind);

  // --- contractions ---
  // dot_general with the result in `result_dtype` (the operands must share a dtype). f32 products ask for
  // precision HIGHEST, so GPUs do not switch to TF32 (torch does not by default either).
  Value dot_general(const Value& lhs, const Value& rhs, const DotDims& dims, DType result_dtype);
  // Convolution of NCHW input by OIHW weight (O = out channels, I = in channels / groups) → NCHW.
  Value convolution(const Value& input, const Value& weight, const ConvParams& params, DType result_dtype);

  // --- indexing ---
  // gather (StableHLO semantics) with `slice_sizes`; the result shape is computed here.
  Value gather(const Value& operand, const Value& indices, const GatherDims& dims,
               const std::vector<int64_t>& slice_sizes);
  // scatter whose update replaces the operand's element (last write wins; give unique indices).
  Value scatter_replace(const Value& operand, const Value& indices, const Value& updates,
                        const ScatterDims& dims);
  // operand with `update` written at the static position `start` (one index per dim).
  Value dynamic_update_slice(const Value& operand, const Value& update, const std::vector<int64_t>& start);
  // The `sizes` window of operand at run-time positions `start` (one rank-0 int64 value per dim; XLA clamps
  // a start so that the window stays inside the operand).
  Value dynamic_slice(const Value& operand, const std::vector<Value>& start,
                      const std::vector<int64_t>& sizes);

  // --- control flow ---
  // stablehlo.while over the values `carry`: `cond` gets the carried values and returns a bool scalar (loop
  // while true), `body` gets them and returns their next values (the same types, in order); returns the
  // values after the last iteration. cond and body build their ops with this builder and may use only the
  // values they are given and what they make themselves: a value from outside reaches them through the carry.
  using LoopCond = std::function<Value(const std::vector<Value>&)>;
  using LoopBody = std::function<std::vector<Value>(const std::vector<Value>&)>;
  std::vector<Value> while_loop(const std::vector<Value>& carry, const LoopCond& cond, const LoopBody& body);

  // --- collectives across the replicas of a multi-replica executable (one replica per in-process rank) ---
  // The elementwise sum of every replica's x (all `replicas` in one group); each replica gets it.
  Value all_reduce_sum(const Value& x, int64_t replicas);
  // Every replica's x concatenated along `dim` in replica order.
  Value all_gather(const Value& x, int64_t dim, int64_t replicas);

  // --- custom calls ---
  // A `stablehlo.custom_call` of `target_name` (api_version 2, no side effect) with row-major operand and
  // result layouts, `backend_config` a string attribute (escaped here), one result per entry of
  // `result_types`.
  struct TensorType {
    DType dtype;
    Shape shape;
  };
  std::vector<Value> custom_call(std::string_view target_name, const std::vector<Value>& operands,
                                 const std::string& backend_config,
                                 const std::vector<TensorType>& result_types);

 private:
  Value make(DType dtype, const Shape& shape);
  // "%7" / "%arg0", after checking v was made here, in the region being built.
  std::string ref(const Value& v) const;
  // One region of a while loop: block arguments of `types`' values, the ops `fill` makes, returning what it
  // returns.
  std::string loop_region(const std::vector<Value>& types,
                          const std::function<std::vector<Value>(const std::vector<Value>&)>& fill);
  // Appends `%id = "stablehlo.<op>"(operands) <{attrs}> : (types) -> type` (attrs omitted when empty).
  Value emit(std::string_view op, const std::vector<Value>& operands, const std::string& attrs, DType dtype,
             const Shape& shape, const std::string& region = "");
  // A reduce / scatter body region: two scalar block args of `dtype`, combined by `combiner` ("add", ...), or
  // returning the second one when combiner is empty (scatter's replace).
  std::string scalar_region(DType dtype, std::string_view combiner);

  std::string module_name_;
  LoweringTarget target_;
  std::vector<Value> params_;
  std::vector<std::string> types_;  // per value id: its tensor type, to catch a Value from another builder
  std::vector<int64_t> arg_index_;  // per value id: its @main argument number, or -1
  std::vector<std::string> names_;  // per value id: its SSA name when not "%id" ("%5#1": a result of %5:2)
  std::vector<std::string> lines_;  // the body of @main (or of the loop region being built), one op a line
  std::vector<int64_t> scope_of_;   // per value id: the region it was made in (0: @main)
  int64_t scope_ = 0;               // the region being built
  int64_t scopes_ = 0;              // regions made so far
  int64_t next_id_ = 0;
  bool lift_scalars_ = false;
  std::vector<LiftedScalar> lifted_;
};

}  // namespace kiln::pjrt::hlo
