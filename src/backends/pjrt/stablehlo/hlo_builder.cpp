#include "backends/pjrt/stablehlo/hlo_builder.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {
namespace {

std::string join(const std::vector<int64_t>& xs, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) s += sep;
    s += std::to_string(xs[i]);
  }
  return s;
}

// `array<i64: 1, 2>` (DenseI64ArrayAttr), `array<i64>` when empty.
std::string i64_array(const std::vector<int64_t>& xs) {
  return xs.empty() ? "array<i64>" : "array<i64: " + join(xs) + ">";
}

// "[0, 1]", the list form inside #stablehlo.dot / gather / scatter attributes.
std::string bracket(const std::vector<int64_t>& xs) {
  return "[" + join(xs) + "]";
}

std::string type_of(const Value& v) {
  return tensor_type(v.dtype, v.shape);
}

std::string describe(const Value& v) {
  return std::string(dtype_name(v.dtype)) + shape_str(v.shape);
}

void check_dims_valid(const std::vector<int64_t>& dims, int64_t rank, const char* op, const char* what) {
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (int64_t d : dims) {
    KILN_CHECK(d >= 0 && d < rank && !seen[static_cast<size_t>(d)],
               "HloBuilder::" << op << ": " << what << " " << shape_str(dims)
                              << " must be distinct dims of a rank-" << rank << " operand");
    seen[static_cast<size_t>(d)] = true;
  }
}

// A float literal that parses back to exactly `value` in `dtype`, or the hex bit pattern of the dtype for
// infinities and NaN (MLIR has no decimal spelling for them).
std::string float_literal(double value, DType dtype) {
  char buf[64];
  if (dtype == DType::Float64) {
    if (!std::isfinite(value)) {
      std::snprintf(buf, sizeof buf, "0x%016llX",
                    static_cast<unsigned long long>(std::bit_cast<uint64_t>(value)));
      return buf;
    }
    std::snprintf(buf, sizeof buf, "%.17e", value);
    return buf;
  }
  float f = static_cast<float>(value);
  uint32_t hex_bits = 0;
  int hex_digits = 8;
  if (dtype == DType::BFloat16) {
    const bf16_t h = f32_to_bf16(f);
    f = bf16_to_f32(h);
    hex_bits = h.bits;
    hex_digits = 4;
  } else if (dtype == DType::Float16) {
    const f16_t h = f32_to_f16(f);
    f = f16_to_f32(h);
    hex_bits = h.bits;
    hex_digits = 4;
  } else {
    hex_bits = std::bit_cast<uint32_t>(f);
  }
  if (!std::isfinite(f)) {
    std::snprintf(buf, sizeof buf, "0x%0*X", hex_digits, hex_bits);
    return buf;
  }
  // 9 significant digits round-trip any float; bf16 / f16 values are floats exactly.
  std::snprintf(buf, sizeof buf, "%.9e", static_cast<double>(f));
  return buf;
}

std::string scalar_literal(double value, DType dtype) {
  if (dtype == DType::Bool) return value != 0.0 ? "true" : "false";
  if (is_floating(dtype)) return float_literal(value, dtype);
  KILN_CHECK(
      std::isfinite(value) && value == std::trunc(value),
      "HloBuilder::splat: " << value << " is not an integer, so not a " << dtype_name(dtype) << " constant");
  return std::to_string(static_cast<long long>(value));
}

// The extreme value a max (min) reduction starts from: -inf (+inf) for floats, the lowest (highest) integer.
double reduce_identity(ReduceKind kind, DType dtype) {
  if (kind == ReduceKind::Sum) return 0.0;
  const bool lowest = kind == ReduceKind::Max;
  if (is_floating(dtype))
    return lowest ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  return visit_dtype(dtype, [&](auto t) -> double {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool>)
      return lowest ? 0.0 : 1.0;
    else if constexpr (std::is_integral_v<T>)
      return static_cast<double>(lowest ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max());
    else
      return 0.0;
  });
}

std::string_view compare_name(Compare c) {
  switch (c) {
    case Compare::EQ:
      return "EQ";
    case Compare::NE:
      return "NE";
    case Compare::LT:
      return "LT";
    case Compare::LE:
      return "LE";
    case Compare::GT:
      return "GT";
    case Compare::GE:
      return "GE";
  }
  return "EQ";
}

}  // namespace

std::string_view element_type(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return "f32";
    case DType::BFloat16:
      return "bf16";
    case DType::Float16:
      return "f16";
    case DType::Float64:
      return "f64";
    case DType::Int64:
      return "i64";
    case DType::Int32:
      return "i32";
    case DType::Int16:
      return "i16";
    case DType::Int8:
      return "i8";
    case DType::UInt8:
      return "ui8";
    case DType::Bool:
      return "i1";
  }
  return "f32";
}

std::string tensor_type(DType dtype, const Shape& shape) {
  std::string s = "tensor<";
  for (int64_t d : shape) s += std::to_string(d) + "x";
  s += element_type(dtype);
  return s + ">";
}

HloBuilder::HloBuilder(std::string module_name, LoweringTarget target)
    : module_name_(std::move(module_name)), target_(std::move(target)) {
  KILN_CHECK(!module_name_.empty() &&
                 std::all_of(module_name_.begin(), module_name_.end(),
                             [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }),
             "HloBuilder: module name '" << module_name_ << "' must be letters, digits and '_'");
}

Value HloBuilder::make(DType dtype, const Shape& shape) {
  for (int64_t d : shape) KILN_CHECK(d >= 0, "HloBuilder: negative dim in " << shape_str(shape));
  Value v{next_id_++, dtype, shape};
  types_.push_back(type_of(v));
  arg_index_.push_back(-1);
  names_.emplace_back();
  scope_of_.push_back(scope_);
  return v;
}

std::string HloBuilder::ref(const Value& v) const {
  KILN_CHECK(v.defined(), "HloBuilder: an operand is an undefined Value (an optional input that is absent?)");
  KILN_CHECK(v.id < next_id_ && types_[static_cast<size_t>(v.id)] == type_of(v),
             "HloBuilder: value %" << v.id << " of type " << type_of(v) << " was not made by this builder"
                                   << (v.id < next_id_
                                           ? " (its type there is " + types_[static_cast<size_t>(v.id)] + ")"
                                           : std::string()));
  KILN_CHECK(scope_of_[static_cast<size_t>(v.id)] == scope_,
             "HloBuilder: value %" << v.id << " is used inside a loop region it was not made in (pass it "
                                   << "through the loop's carry)");
  const int64_t arg = arg_index_[static_cast<size_t>(v.id)];
  if (const std::string& name = names_[static_cast<size_t>(v.id)]; !name.empty()) return name;
  return arg >= 0 ? "%arg" + std::to_string(arg) : "%" + std::to_string(v.id);
}

Value HloBuilder::parameter(DType dtype, const Shape& shape) {
  KILN_CHECK(scope_ == 0, "HloBuilder: a parameter of @main cannot be made inside a loop region");
  Value v = make(dtype, shape);
  arg_index_.back() = static_cast<int64_t>(params_.size());
  params_.push_back(v);
  return v;
}

Value HloBuilder::emit(std::string_view op, const std::vector<Value>& operands, const std::string& attrs,
                       DType dtype, const Shape& shape, const std::string& region) {
  std::string operand_list, operand_types;
  for (size_t i = 0; i < operands.size(); ++i) {
    if (i) {
      operand_list += ", ";
      operand_types += ", ";
    }
    operand_list += ref(operands[i]);
    operand_types += type_of(operands[i]);
  }
  Value result = make(dtype, shape);
  const std::string dialect = op.find('.') == std::string_view::npos ? "stablehlo." : "";
  std::string line = ref(result) + " = \"" + dialect + std::string(op) + "\"(" + operand_list + ")";
  if (!attrs.empty()) line += " <{" + attrs + "}>";
  if (!region.empty()) line += " (" + region + ")";
  line += " : (" + operand_types + ") -> " + type_of(result);
  lines_.push_back(std::move(line));
  return result;
}

std::string HloBuilder::module_text(const std::vector<Value>& results) const {
  std::ostringstream out;
  out << "module @" << module_name_ << " {\n  func.func public @main(";
  for (size_t i = 0; i < params_.size(); ++i)
    out << (i ? ", " : "") << ref(params_[i]) << ": " << type_of(params_[i]);
  out << ") -> (";
  std::string result_list, result_types;
  for (size_t i = 0; i < results.size(); ++i) {
    result_list += (i ? ", " : "") + ref(results[i]);
    result_types += (i ? ", " : "") + type_of(results[i]);
  }
  out << result_types << ") {\n";
  for (const std::string& line : lines_) out << "    " << line << "\n";
  out << "    \"func.return\"(" << result_list << ") : (" << result_types << ") -> ()\n  }\n}\n";
  return out.str();
}

// --- constants ---

Value HloBuilder::splat(double value, DType dtype, const Shape& shape) {
  const std::string literal = scalar_literal(value, dtype);
  const std::string type = tensor_type(dtype, shape);
  return emit("constant", {}, "value = dense<" + literal + "> : " + type, dtype, shape);
}

Value HloBuilder::scalar_operand(double value, DType dtype, const Shape& shape) {
  if (!lift_scalars_) return splat(value, dtype, shape);
  const Value p = parameter(dtype, {});
  lifted_.push_back({num_parameters() - 1, value, dtype});
  return broadcast_to(p, shape);
}

Value HloBuilder::constant_ints(const std::vector<int64_t>& values, DType dtype, const Shape& shape) {
  KILN_CHECK(dtype == DType::Int64 || dtype == DType::Int32,
             "HloBuilder::constant_ints: dtype must be int64 or int32, got " << dtype_name(dtype));
  KILN_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
             "HloBuilder::constant_ints: " << values.size() << " values for shape " << shape_str(shape));
  // Nested brackets, one level per dim (MLIR checks the nesting against the type); `dense<>` when empty.
  std::string body;
  size_t next = 0;
  auto write = [&](auto&& self, size_t dim) -> void {
    if (dim == shape.size()) {
      body += std::to_string(values[next++]);
      return;
    }
    body += "[";
    for (int64_t i = 0; i < shape[dim]; ++i) {
      if (i) body += ", ";
      self(self, dim + 1);
    }
    body += "]";
  };
  if (!values.empty()) write(write, 0);
  return emit("constant", {}, "value = dense<" + body + "> : " + tensor_type(dtype, shape), dtype, shape);
}

Value HloBuilder::iota(DType dtype, const Shape& shape, int64_t dim) {
  KILN_CHECK(dim >= 0 && dim < static_cast<int64_t>(shape.size()),
             "HloBuilder::iota: dim " << dim << " outside shape " << shape_str(shape));
  return emit("iota", {}, "iota_dimension = " + std::to_string(dim) + " : i64", dtype, shape);
}

// --- elementwise ---

Value HloBuilder::unary(std::string_view op, const Value& x) {
  return emit(op, {x}, "", x.dtype, x.shape);
}

Value HloBuilder::binary(std::string_view op, const Value& a, const Value& b) {
  KILN_CHECK(
      a.dtype == b.dtype && a.shape == b.shape,
      "HloBuilder::" << op << ": operands must have one type, got " << describe(a) << " and " << describe(b));
  return emit(op, {a, b}, "", a.dtype, a.shape);
}

Value HloBuilder::binary_bcast(std::string_view op, const Value& a, const Value& b) {
  const Shape shape = broadcast_shapes(a.shape, b.shape, "HloBuilder::binary_bcast");
  return binary(op, broadcast_to(a, shape), broadcast_to(b, shape));
}

Value HloBuilder::compare(Compare cmp, const Value& a, const Value& b) {
  KILN_CHECK(
      a.dtype == b.dtype && a.shape == b.shape,
      "HloBuilder::compare: operands must have one type, got " << describe(a) << " and " << describe(b));
  const char* type = is_floating(a.dtype)                                  ? "FLOAT"
                     : (a.dtype == DType::Bool || a.dtype == DType::UInt8) ? "UNSIGNED"
                                                                           : "SIGNED";
  const std::string attrs = "comparison_direction = #stablehlo<comparison_direction " +
                            std::string(compare_name(cmp)) + ">, compare_type = #stablehlo<comparison_type " +
                            type + ">";
  return emit("compare", {a, b}, attrs, DType::Bool, a.shape);
}

Value HloBuilder::select(const Value& pred, const Value& on_true, const Value& on_false) {
  KILN_CHECK(on_true.dtype == on_false.dtype && on_true.shape == on_false.shape,
             "HloBuilder::select: branches must have one type, got " << describe(on_true) << " and "
                                                                     << describe(on_false));
  KILN_CHECK(pred.dtype == DType::Bool && (pred.shape == on_true.shape || pred.shape.empty()),
             "HloBuilder::select: the predicate must be bool of shape "
                 << shape_str(on_true.shape) << " or a scalar, got " << describe(pred));
  return emit("select", {pred, on_true, on_false}, "", on_true.dtype, on_true.shape);
}

Value HloBuilder::convert(const Value& x, DType dtype) {
  if (x.dtype == dtype) return x;
  // x → bool is x != 0, written as a comparison so no plugin's convert-to-i1 rule is relied on.
  if (dtype == DType::Bool) return compare(Compare::NE, x, splat(0.0, x.dtype, x.shape));
  return emit("convert", {x}, "", dtype, x.shape);
}

// --- shapes ---

Value HloBuilder::broadcast_in_dim(const Value& x, const Shape& shape, const std::vector<int64_t>& dims) {
  KILN_CHECK(
      static_cast<int64_t>(dims.size()) == x.rank(),
      "HloBuilder::broadcast_in_dim: " << dims.size() << " dims for a rank-" << x.rank() << " operand");
  check_dims_valid(dims, static_cast<int64_t>(shape.size()), "broadcast_in_dim", "dims");
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t from = x.shape[i], to = shape[static_cast<size_t>(dims[i])];
    KILN_CHECK(from == 1 || from == to, "HloBuilder::broadcast_in_dim: dim " << i << " of " << describe(x)
                                                                             << " cannot broadcast to "
                                                                             << shape_str(shape));
  }
  return emit("broadcast_in_dim", {x}, "broadcast_dimensions = " + i64_array(dims), x.dtype, shape);
}

Value HloBuilder::broadcast_to(const Value& x, const Shape& shape) {
  if (x.shape == shape) return x;
  KILN_CHECK(x.rank() <= static_cast<int64_t>(shape.size()),
             "HloBuilder::broadcast_to: " << describe(x) << " has more dims than " << shape_str(shape));
  const int64_t lead = static_cast<int64_t>(shape.size()) - x.rank();
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.rank(); ++i) dims.push_back(lead + i);
  return broadcast_in_dim(x, shape, dims);
}

Value HloBuilder::reshape(const Value& x, const Shape& shape) {
  if (x.shape == shape) return x;
  KILN_CHECK(shape_numel(shape) == x.numel(), "HloBuilder::reshape: " << describe(x) << " has " << x.numel()
                                                                      << " elements, " << shape_str(shape)
                                                                      << " needs " << shape_numel(shape));
  return emit("reshape", {x}, "", x.dtype, shape);
}

Value HloBuilder::transpose(const Value& x, const std::vector<int64_t>& perm) {
  KILN_CHECK(static_cast<int64_t>(perm.size()) == x.rank(),
             "HloBuilder::transpose: permutation " << shape_str(perm) << " for " << describe(x));
  check_dims_valid(perm, x.rank(), "transpose", "permutation");
  bool identity = true;
  Shape shape;
  for (size_t i = 0; i < perm.size(); ++i) {
    identity = identity && perm[i] == static_cast<int64_t>(i);
    shape.push_back(x.shape[static_cast<size_t>(perm[i])]);
  }
  if (identity) return x;
  return emit("transpose", {x}, "permutation = " + i64_array(perm), x.dtype, shape);
}

Value HloBuilder::slice(const Value& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
                        const std::vector<int64_t>& strides_in) {
  const std::vector<int64_t> strides =
      strides_in.empty() ? std::vector<int64_t>(x.shape.size(), 1) : strides_in;
  KILN_CHECK(
      start.size() == x.shape.size() && limit.size() == x.shape.size() && strides.size() == x.shape.size(),
      "HloBuilder::slice: start/limit/strides need " << x.rank() << " entries for " << describe(x));
  Shape shape;
  for (size_t d = 0; d < x.shape.size(); ++d) {
    KILN_CHECK(0 <= start[d] && start[d] <= limit[d] && limit[d] <= x.shape[d] && strides[d] >= 1,
               "HloBuilder::slice: dim " << d << " range [" << start[d] << ", " << limit[d] << ") step "
                                         << strides[d] << " outside " << describe(x));
    shape.push_back((limit[d] - start[d] + strides[d] - 1) / strides[d]);
  }
  if (shape == x.shape) return x;
  const std::string attrs = "start_indices = " + i64_array(start) + ", limit_indices = " + i64_array(limit) +
                            ", strides = " + i64_array(strides);
  return emit("slice", {x}, attrs, x.dtype, shape);
}

Value HloBuilder::slice_dim(const Value& x, int64_t dim, int64_t start, int64_t limit) {
  KILN_CHECK(dim >= 0 && dim < x.rank(), "HloBuilder::slice_dim: dim " << dim << " outside " << describe(x));
  std::vector<int64_t> lo(x.shape.size(), 0), hi(x.shape.begin(), x.shape.end());
  lo[static_cast<size_t>(dim)] = start;
  hi[static_cast<size_t>(dim)] = limit;
  return slice(x, lo, hi);
}

Value HloBuilder::concatenate(const std::vector<Value>& xs, int64_t dim) {
  KILN_CHECK(!xs.empty(), "HloBuilder::concatenate: no operands");
  if (xs.size() == 1) return xs[0];
  Shape shape = xs[0].shape;
  KILN_CHECK(dim >= 0 && dim < xs[0].rank(),
             "HloBuilder::concatenate: dim " << dim << " outside " << describe(xs[0]));
  shape[static_cast<size_t>(dim)] = 0;
  for (const Value& x : xs) {
    bool same = x.dtype == xs[0].dtype && x.rank() == xs[0].rank();
    for (int64_t d = 0; same && d < x.rank(); ++d)
      same = d == dim || x.shape[static_cast<size_t>(d)] == xs[0].shape[static_cast<size_t>(d)];
    KILN_CHECK(same, "HloBuilder::concatenate: " << describe(x) << " does not match " << describe(xs[0])
                                                 << " outside dim " << dim);
    shape[static_cast<size_t>(dim)] += x.shape[static_cast<size_t>(dim)];
  }
  return emit("concatenate", xs, "dimension = " + std::to_string(dim) + " : i64", xs[0].dtype, shape);
}

Value HloBuilder::pad(const Value& x, const Value& pad_value, const std::vector<int64_t>& low,
                      const std::vector<int64_t>& high) {
  KILN_CHECK(pad_value.dtype == x.dtype && pad_value.rank() == 0,
             "HloBuilder::pad: the padding value must be a " << dtype_name(x.dtype) << " scalar, got "
                                                             << describe(pad_value));
  KILN_CHECK(static_cast<int64_t>(low.size()) == x.rank() && static_cast<int64_t>(high.size()) == x.rank(),
             "HloBuilder::pad: low and high need " << x.rank() << " entries for " << describe(x));
  Shape shape = x.shape;
  for (size_t d = 0; d < shape.size(); ++d) {
    KILN_CHECK(low[d] >= 0 && high[d] >= 0,
               "HloBuilder::pad: negative padding " << shape_str(low) << " / " << shape_str(high));
    shape[d] += low[d] + high[d];
  }
  if (shape == x.shape) return x;
  const std::string attrs = "edge_padding_low = " + i64_array(low) +
                            ", edge_padding_high = " + i64_array(high) +
                            ", interior_padding = " + i64_array(std::vector<int64_t>(shape.size(), 0));
  return emit("pad", {x, pad_value}, attrs, x.dtype, shape);
}

// --- reductions ---

std::string HloBuilder::scalar_region(DType dtype, std::string_view combiner) {
  // Block arguments and the body's values take numbers from the same counter as everything else: MLIR forbids
  // a nested region from reusing a name visible from above.
  const Value lhs = make(dtype, {}), rhs = make(dtype, {});
  const std::string t = tensor_type(dtype, {});
  std::string r = "{\n    ^bb0(" + ref(lhs) + ": " + t + ", " + ref(rhs) + ": " + t + "):\n";
  std::string returned = ref(rhs);
  if (!combiner.empty()) {
    const Value out = make(dtype, {});
    r += "      " + ref(out) + " = \"stablehlo." + std::string(combiner) + "\"(" + ref(lhs) + ", " +
         ref(rhs) + ") : (" + t + ", " + t + ") -> " + t + "\n";
    returned = ref(out);
  }
  r += "      \"stablehlo.return\"(" + returned + ") : (" + t + ") -> ()\n    }";
  return r;
}

Value HloBuilder::reduce(const Value& x, const std::vector<int64_t>& dims, ReduceKind kind) {
  check_dims_valid(dims, x.rank(), "reduce", "dims");
  KILN_CHECK(std::is_sorted(dims.begin(), dims.end()),
             "HloBuilder::reduce: dims " << shape_str(dims) << " unsorted");
  if (dims.empty()) return x;
  Shape shape;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (!std::binary_search(dims.begin(), dims.end(), d)) shape.push_back(x.shape[static_cast<size_t>(d)]);
  const Value init = scalar(reduce_identity(kind, x.dtype), x.dtype);
  const char* combiner = kind == ReduceKind::Sum ? "add" : kind == ReduceKind::Max ? "maximum" : "minimum";
  const std::string region = scalar_region(x.dtype, combiner);
  return emit("reduce", {x, init}, "dimensions = " + i64_array(dims), x.dtype, shape, region);
}

// --- contractions ---

Value HloBuilder::dot_general(const Value& lhs, const Value& rhs, const DotDims& dims, DType result_dtype) {
  KILN_CHECK(lhs.dtype == rhs.dtype,
             "HloBuilder::dot_general: operand dtypes differ: " << describe(lhs) << " and " << describe(rhs));
  KILN_CHECK(
      dims.lhs_batch.size() == dims.rhs_batch.size() && dims.lhs_contract.size() == dims.rhs_contract.size(),
      "HloBuilder::dot_general: batch and contracting dims must pair up");
  std::vector<int64_t> lhs_used = dims.lhs_batch, rhs_used = dims.rhs_batch;
  lhs_used.insert(lhs_used.end(), dims.lhs_contract.begin(), dims.lhs_contract.end());
  rhs_used.insert(rhs_used.end(), dims.rhs_contract.begin(), dims.rhs_contract.end());
  check_dims_valid(lhs_used, lhs.rank(), "dot_general", "lhs batch+contracting dims");
  check_dims_valid(rhs_used, rhs.rank(), "dot_general", "rhs batch+contracting dims");
  Shape shape;
  for (size_t i = 0; i < dims.lhs_batch.size(); ++i) {
    const int64_t a = lhs.shape[static_cast<size_t>(dims.lhs_batch[i])];
    KILN_CHECK(
        a == rhs.shape[static_cast<size_t>(dims.rhs_batch[i])],
        "HloBuilder::dot_general: batch dims differ in size: " << describe(lhs) << " and " << describe(rhs));
    shape.push_back(a);
  }
  for (size_t i = 0; i < dims.lhs_contract.size(); ++i)
    KILN_CHECK(lhs.shape[static_cast<size_t>(dims.lhs_contract[i])] ==
                   rhs.shape[static_cast<size_t>(dims.rhs_contract[i])],
               "HloBuilder::dot_general: contracting dims differ in size: " << describe(lhs) << " and "
                                                                            << describe(rhs));
  for (int64_t d = 0; d < lhs.rank(); ++d)
    if (std::find(lhs_used.begin(), lhs_used.end(), d) == lhs_used.end())
      shape.push_back(lhs.shape[static_cast<size_t>(d)]);
  for (int64_t d = 0; d < rhs.rank(); ++d)
    if (std::find(rhs_used.begin(), rhs_used.end(), d) == rhs_used.end())
      shape.push_back(rhs.shape[static_cast<size_t>(d)]);
  // Empty lists are left out, as StableHLO prints them.
  std::string dn;
  auto field = [&](const char* name, const std::vector<int64_t>& xs) {
    if (xs.empty()) return;
    dn += (dn.empty() ? "" : ", ") + std::string(name) + " = " + bracket(xs);
  };
  field("lhs_batching_dimensions", dims.lhs_batch);
  field("rhs_batching_dimensions", dims.rhs_batch);
  field("lhs_contracting_dimensions", dims.lhs_contract);
  field("rhs_contracting_dimensions", dims.rhs_contract);
  std::string attrs = "dot_dimension_numbers = #stablehlo.dot<" + dn + ">";
  if (lhs.dtype == DType::Float32)
    attrs += ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]";
  return emit("dot_general", {lhs, rhs}, attrs, result_dtype, shape);
}

Value HloBuilder::convolution(const Value& input, const Value& weight, const ConvParams& p,
                              DType result_dtype) {
  const int64_t spatial = input.rank() - 2;
  KILN_CHECK(spatial >= 1 && weight.rank() == input.rank() && input.dtype == weight.dtype,
             "HloBuilder::convolution: input " << describe(input) << " and weight " << describe(weight)
                                               << " must be NC... and OI... of one dtype");
  KILN_CHECK(static_cast<int64_t>(p.strides.size()) == spatial &&
                 static_cast<int64_t>(p.pad.size()) == spatial &&
                 static_cast<int64_t>(p.dilation.size()) == spatial && p.groups >= 1,
             "HloBuilder::convolution: strides, padding and dilation need " << spatial << " entries each");
  KILN_CHECK(input.shape[1] == weight.shape[1] * p.groups && weight.shape[0] % p.groups == 0,
             "HloBuilder::convolution: input channels " << input.shape[1] << " != weight's "
                                                        << weight.shape[1] << " x groups " << p.groups);
  Shape shape{input.shape[0], weight.shape[0]};
  std::string layout = "[b, f";
  std::string kernel_layout = "[o, i";
  std::string pad = "dense<[";
  std::vector<int64_t> ones;
  for (int64_t s = 0; s < spatial; ++s) {
    const size_t i = static_cast<size_t>(s);
    const int64_t in = input.shape[i + 2] + p.pad[i].first + p.pad[i].second;
    const int64_t k = (weight.shape[i + 2] - 1) * p.dilation[i] + 1;
    KILN_CHECK(in >= k && p.strides[i] >= 1,
               "HloBuilder::convolution: kernel " << describe(weight) << " larger than the padded input");
    shape.push_back((in - k) / p.strides[i] + 1);
    layout += ", " + std::to_string(s);
    kernel_layout += ", " + std::to_string(s);
    pad += (s ? ", [" : "[") + std::to_string(p.pad[i].first) + ", " + std::to_string(p.pad[i].second) + "]";
    ones.push_back(1);
  }
  layout += "]";
  kernel_layout += "]";
  pad += "]> : tensor<" + std::to_string(spatial) + "x2xi64>";
  std::string attrs = "dimension_numbers = #stablehlo.conv<" + layout + "x" + kernel_layout + "->" + layout +
                      ">, window_strides = " + i64_array(p.strides) + ", padding = " + pad +
                      ", lhs_dilation = " + i64_array(ones) + ", rhs_dilation = " + i64_array(p.dilation) +
                      ", feature_group_count = " + std::to_string(p.groups) +
                      " : i64, batch_group_count = 1 : i64";
  if (input.dtype == DType::Float32)
    attrs += ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]";
  return emit("convolution", {input, weight}, attrs, result_dtype, shape);
}

// --- indexing ---

Value HloBuilder::gather(const Value& operand, const Value& indices, const GatherDims& dims,
                         const std::vector<int64_t>& slice_sizes) {
  KILN_CHECK(is_integral(indices.dtype),
             "HloBuilder::gather: indices must be integers, got " << describe(indices));
  KILN_CHECK(static_cast<int64_t>(slice_sizes.size()) == operand.rank(),
             "HloBuilder::gather: " << slice_sizes.size() << " slice sizes for " << describe(operand));
  KILN_CHECK(
      dims.index_vector_dim >= 0 && dims.index_vector_dim <= indices.rank(),
      "HloBuilder::gather: index_vector_dim " << dims.index_vector_dim << " outside " << describe(indices));
  check_dims_valid(dims.collapsed_slice_dims, operand.rank(), "gather", "collapsed_slice_dims");
  check_dims_valid(dims.start_index_map, operand.rank(), "gather", "start_index_map");
  const int64_t index_len =
      dims.index_vector_dim < indices.rank() ? indices.shape[static_cast<size_t>(dims.index_vector_dim)] : 1;
  KILN_CHECK(index_len == static_cast<int64_t>(dims.start_index_map.size()),
             "HloBuilder::gather: index vectors of " << index_len << " entries for a start_index_map of "
                                                     << dims.start_index_map.size());
  Shape batch, offsets;
  for (int64_t d = 0; d < indices.rank(); ++d)
    if (d != dims.index_vector_dim) batch.push_back(indices.shape[static_cast<size_t>(d)]);
  for (int64_t d = 0; d < operand.rank(); ++d) {
    const int64_t size = slice_sizes[static_cast<size_t>(d)];
    KILN_CHECK(
        size >= 0 && size <= operand.shape[static_cast<size_t>(d)],
        "HloBuilder::gather: slice size " << size << " outside dim " << d << " of " << describe(operand));
    const bool collapsed = std::find(dims.collapsed_slice_dims.begin(), dims.collapsed_slice_dims.end(), d) !=
                           dims.collapsed_slice_dims.end();
    KILN_CHECK(!collapsed || size == 1,
               "HloBuilder::gather: collapsed dim " << d << " must have slice size 1");
    if (!collapsed) offsets.push_back(size);
  }
  KILN_CHECK(offsets.size() == dims.offset_dims.size(),
             "HloBuilder::gather: " << dims.offset_dims.size() << " offset_dims for " << offsets.size()
                                    << " uncollapsed slice dims");
  const int64_t rank = static_cast<int64_t>(batch.size() + offsets.size());
  check_dims_valid(dims.offset_dims, rank, "gather", "offset_dims");
  Shape shape;
  size_t next_batch = 0, next_offset = 0;
  for (int64_t d = 0; d < rank; ++d) {
    const bool is_offset =
        std::find(dims.offset_dims.begin(), dims.offset_dims.end(), d) != dims.offset_dims.end();
    shape.push_back(is_offset ? offsets[next_offset++] : batch[next_batch++]);
  }
  std::string dn = "offset_dims = " + bracket(dims.offset_dims);
  if (!dims.collapsed_slice_dims.empty())
    dn += ", collapsed_slice_dims = " + bracket(dims.collapsed_slice_dims);
  dn += ", start_index_map = " + bracket(dims.start_index_map) +
        ", index_vector_dim = " + std::to_string(dims.index_vector_dim);
  const std::string attrs = "dimension_numbers = #stablehlo.gather<" + dn +
                            ">, slice_sizes = " + i64_array(slice_sizes) + ", indices_are_sorted = false";
  return emit("gather", {operand, indices}, attrs, operand.dtype, shape);
}

Value HloBuilder::scatter_replace(const Value& operand, const Value& indices, const Value& updates,
                                  const ScatterDims& dims) {
  KILN_CHECK(is_integral(indices.dtype),
             "HloBuilder::scatter: indices must be integers, got " << describe(indices));
  KILN_CHECK(updates.dtype == operand.dtype, "HloBuilder::scatter: updates " << describe(updates)
                                                                             << " must have the dtype of "
                                                                             << describe(operand));
  check_dims_valid(dims.update_window_dims, updates.rank(), "scatter", "update_window_dims");
  check_dims_valid(dims.inserted_window_dims, operand.rank(), "scatter", "inserted_window_dims");
  check_dims_valid(dims.scatter_dims_to_operand_dims, operand.rank(), "scatter",
                   "scatter_dims_to_operand_dims");
  KILN_CHECK(static_cast<int64_t>(dims.update_window_dims.size() + dims.inserted_window_dims.size()) ==
                 operand.rank(),
             "HloBuilder::scatter: window dims + inserted dims must cover the operand's " << operand.rank()
                                                                                          << " dims");
  std::string dn;
  if (!dims.update_window_dims.empty())
    dn += "update_window_dims = " + bracket(dims.update_window_dims) + ", ";
  if (!dims.inserted_window_dims.empty())
    dn += "inserted_window_dims = " + bracket(dims.inserted_window_dims) + ", ";
  dn += "scatter_dims_to_operand_dims = " + bracket(dims.scatter_dims_to_operand_dims) +
        ", index_vector_dim = " + std::to_string(dims.index_vector_dim);
  const std::string attrs = "scatter_dimension_numbers = #stablehlo.scatter<" + dn +
                            ">, indices_are_sorted = false, unique_indices = false";
  const std::string region = scalar_region(operand.dtype, "");
  return emit("scatter", {operand, indices, updates}, attrs, operand.dtype, operand.shape, region);
}

Value HloBuilder::dynamic_update_slice(const Value& operand, const Value& update,
                                       const std::vector<int64_t>& start) {
  KILN_CHECK(update.dtype == operand.dtype && update.rank() == operand.rank() &&
                 static_cast<int64_t>(start.size()) == operand.rank(),
             "HloBuilder::dynamic_update_slice: update " << describe(update) << " at " << shape_str(start)
                                                         << " into " << describe(operand));
  for (size_t d = 0; d < start.size(); ++d)
    KILN_CHECK(start[d] >= 0 && start[d] + update.shape[d] <= operand.shape[d],
               "HloBuilder::dynamic_update_slice: update " << describe(update) << " at " << shape_str(start)
                                                           << " runs past " << describe(operand));
  std::vector<Value> operands{operand, update};
  for (int64_t s : start) operands.push_back(scalar(static_cast<double>(s), DType::Int64));
  return emit("dynamic_update_slice", operands, "", operand.dtype, operand.shape);
}

Value HloBuilder::dynamic_slice(const Value& operand, const std::vector<Value>& start,
                                const std::vector<int64_t>& sizes) {
  KILN_CHECK(static_cast<int64_t>(start.size()) == operand.rank() &&
                 static_cast<int64_t>(sizes.size()) == operand.rank(),
             "HloBuilder::dynamic_slice: " << start.size() << " starts and " << sizes.size() << " sizes for "
                                           << describe(operand));
  for (size_t d = 0; d < sizes.size(); ++d) {
    KILN_CHECK(
        start[d].rank() == 0 && start[d].dtype == DType::Int64,
        "HloBuilder::dynamic_slice: start " << d << " is " << describe(start[d]) << ", not an i64 scalar");
    KILN_CHECK(sizes[d] >= 0 && sizes[d] <= operand.shape[d], "HloBuilder::dynamic_slice: size "
                                                                  << sizes[d] << " of dim " << d
                                                                  << " outside " << describe(operand));
  }
  std::vector<Value> operands{operand};
  operands.insert(operands.end(), start.begin(), start.end());
  return emit("dynamic_slice", operands, "slice_sizes = " + i64_array(sizes), operand.dtype, sizes);
}

// --- control flow ---

std::string HloBuilder::loop_region(
    const std::vector<Value>& types,
    const std::function<std::vector<Value>(const std::vector<Value>&)>& fill) {
  std::vector<std::string> outer_lines;
  outer_lines.swap(lines_);
  const int64_t outer_scope = scope_;
  scope_ = ++scopes_;
  std::string region, returned, returned_types;
  try {
    std::vector<Value> args;
    std::string header;
    for (size_t i = 0; i < types.size(); ++i) {
      args.push_back(make(types[i].dtype, types[i].shape));
      header += (i ? ", " : "") + ref(args.back()) + ": " + type_of(args.back());
    }
    const std::vector<Value> results = fill(args);
    for (size_t i = 0; i < results.size(); ++i) {
      returned += (i ? ", " : "") + ref(results[i]);
      returned_types += (i ? ", " : "") + type_of(results[i]);
    }
    region = "{\n    ^bb0(" + header + "):\n";
    for (const std::string& line : lines_) region += "      " + line + "\n";
    region += "      \"stablehlo.return\"(" + returned + ") : (" + returned_types + ") -> ()\n    }";
  } catch (...) {
    lines_.swap(outer_lines);
    scope_ = outer_scope;
    throw;
  }
  lines_.swap(outer_lines);
  scope_ = outer_scope;
  return region;
}

std::vector<Value> HloBuilder::while_loop(const std::vector<Value>& carry, const LoopCond& cond,
                                          const LoopBody& body) {
  KILN_CHECK(!carry.empty(), "HloBuilder::while_loop: nothing carried");
  std::string operand_list, operand_types;
  for (size_t i = 0; i < carry.size(); ++i) {
    operand_list += (i ? ", " : "") + ref(carry[i]);
    operand_types += (i ? ", " : "") + type_of(carry[i]);
  }
  const std::string cond_region = loop_region(carry, [&](const std::vector<Value>& args) {
    const Value go = cond(args);
    KILN_CHECK(go.rank() == 0 && go.dtype == DType::Bool,
               "HloBuilder::while_loop: the condition is " << describe(go) << ", not a bool scalar");
    return std::vector<Value>{go};
  });
  const std::string body_region = loop_region(carry, [&](const std::vector<Value>& args) {
    std::vector<Value> next = body(args);
    KILN_CHECK(next.size() == carry.size(),
               "HloBuilder::while_loop: the body returns " << next.size() << " values for " << carry.size());
    for (size_t i = 0; i < next.size(); ++i)
      KILN_CHECK(type_of(next[i]) == type_of(carry[i]), "HloBuilder::while_loop: the body returns "
                                                            << describe(next[i]) << " for carried "
                                                            << describe(carry[i]));
    return next;
  });
  std::vector<Value> results;
  for (const Value& v : carry) results.push_back(make(v.dtype, v.shape));
  const std::string base = "%" + std::to_string(results.front().id);
  const bool several = results.size() > 1;
  if (several)
    for (size_t i = 0; i < results.size(); ++i)
      names_[static_cast<size_t>(results[i].id)] = base + "#" + std::to_string(i);
  lines_.push_back((several ? base + ":" + std::to_string(results.size()) : base) +
                   " = \"stablehlo.while\"(" + operand_list + ") (" + cond_region + ", " + body_region +
                   ") : (" + operand_types + ") -> " + (several ? "(" + operand_types + ")" : operand_types));
  return results;
}

// --- collectives ---

namespace {

// `replica_groups = dense<[[0, 1, ..., n-1]]> : tensor<1xnxi64>`: one group of every replica.
std::string one_replica_group(int64_t replicas) {
  std::string ids;
  for (int64_t r = 0; r < replicas; ++r) ids += (r ? ", " : "") + std::to_string(r);
  return "replica_groups = dense<[[" + ids + "]]> : tensor<1x" + std::to_string(replicas) + "xi64>";
}

}  // namespace

Value HloBuilder::all_reduce_sum(const Value& x, int64_t replicas) {
  KILN_CHECK(replicas >= 1, "HloBuilder::all_reduce_sum: " << replicas << " replicas");
  const std::string region = scalar_region(x.dtype, "add");
  return emit("all_reduce", {x}, one_replica_group(replicas), x.dtype, x.shape, region);
}

Value HloBuilder::all_gather(const Value& x, int64_t dim, int64_t replicas) {
  KILN_CHECK(replicas >= 1, "HloBuilder::all_gather: " << replicas << " replicas");
  KILN_CHECK(dim >= 0 && dim < x.rank(), "HloBuilder::all_gather: dim " << dim << " outside " << describe(x));
  Shape shape = x.shape;
  shape[static_cast<size_t>(dim)] *= replicas;
  return emit("all_gather", {x},
              "all_gather_dim = " + std::to_string(dim) + " : i64, " + one_replica_group(replicas), x.dtype,
              shape);
}

// --- custom calls ---

namespace {

// `text` as an MLIR string literal's contents: quotes, backslashes and control characters as \XX hex escapes
// (how MLIR's printer writes them, and what JAX's modules show: \22 for ").
std::string mlir_string_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\' || u < 0x20 || u >= 0x7f) {
      char hex[4];
      std::snprintf(hex, sizeof hex, "\\%02X", u);
      out += hex;
    } else {
      out += c;
    }
  }
  return out;
}

// A row-major layout (minor_to_major n-1, ..., 0) as custom_call's operand_layouts / result_layouts write it.
std::string row_major_layout(size_t rank) {
  // MLIR prints a one-element array as a splat: dense<0>.
  if (rank == 0) return "dense<> : tensor<0xindex>";
  if (rank == 1) return "dense<0> : tensor<1xindex>";
  std::string dims;
  for (size_t i = rank; i-- > 0;) dims += (dims.empty() ? "" : ", ") + std::to_string(i);
  return "dense<[" + dims + "]> : tensor<" + std::to_string(rank) + "xindex>";
}

}  // namespace

std::vector<Value> HloBuilder::custom_call(std::string_view target_name, const std::vector<Value>& operands,
                                           const std::string& backend_config,
                                           const std::vector<TensorType>& result_types) {
  KILN_CHECK(!result_types.empty(), "HloBuilder::custom_call " << target_name << ": no results");
  std::string operand_list, operand_types, operand_layouts, result_layouts, result_type_list;
  for (size_t i = 0; i < operands.size(); ++i) {
    const std::string sep = i ? ", " : "";
    operand_list += sep + ref(operands[i]);
    operand_types += sep + type_of(operands[i]);
    operand_layouts += sep + row_major_layout(operands[i].shape.size());
  }
  std::vector<Value> results;
  for (size_t i = 0; i < result_types.size(); ++i) {
    results.push_back(make(result_types[i].dtype, result_types[i].shape));
    const std::string sep = i ? ", " : "";
    result_type_list += sep + type_of(results.back());
    result_layouts += sep + row_major_layout(result_types[i].shape.size());
  }
  // One op with several results is `%N:k = ...`, its results %N#0 ... %N#(k-1).
  const std::string base = "%" + std::to_string(results.front().id);
  const bool several = results.size() > 1;
  if (several)
    for (size_t i = 0; i < results.size(); ++i)
      names_[static_cast<size_t>(results[i].id)] = base + "#" + std::to_string(i);
  std::string line = (several ? base + ":" + std::to_string(results.size()) : base) +
                     " = \"stablehlo.custom_call\"(" + operand_list +
                     ") <{api_version = 2 : i32, backend_config = \"" + mlir_string_escape(backend_config) +
                     "\", call_target_name = \"" + std::string(target_name) +
                     "\", called_computations = [], has_side_effect = false, operand_layouts = [" +
                     operand_layouts + "], result_layouts = [" + result_layouts + "]}> : (" + operand_types +
                     ") -> " + (several ? "(" + result_type_list + ")" : result_type_list);
  lines_.push_back(std::move(line));
  return results;
}

}  // namespace kiln::pjrt::hlo
