// Front ends of sum, mean, max and var. Each brings its input into a contiguous [outer, r, inner] layout
// (a view when the reduced dimensions allow it, otherwise one copy), so that the kernels only ever reduce the
// middle extent of a contiguous tensor.
#include "kiln/ops/reduction.h"

#include <algorithm>

#include "runtime/dispatcher.h"

namespace kiln {

namespace {

struct ReducePlan {
  Tensor x3;        // contiguous [outer, r, inner]
  Shape out_shape;  // as the user sees it (keepdim applied)
  int64_t outer = 1, r = 1, inner = 1;
};

ReducePlan plan_reduction(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  KILN_CHECK(x.defined(), op << ": input is an undefined tensor");
  const int64_t rank = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(rank), dims.empty());
  for (int64_t d : dims) {
    // A 0-d tensor accepts dim 0 / -1 like torch.
    const int64_t nd = normalize_dim(d, std::max<int64_t>(rank, 1), op);
    if (rank == 0) continue;
    KILN_CHECK(!reduced[static_cast<size_t>(nd)],
               op << ": dimension " << d << " appears more than once in dims " << shape_str(dims));
    reduced[static_cast<size_t>(nd)] = true;
  }
  ReducePlan plan;
  if (rank == 0) {  // Tensor::view cannot reshape a 0-d tensor, so build the [1, 1, 1] view directly.
    plan.x3 = Tensor(x.storage(), {1, 1, 1}, {1, 1, 1}, x.offset(), x.dtype());
    return plan;
  }
  std::vector<int64_t> kept_dims, reduced_dims;
  for (int64_t d = 0; d < rank; ++d) {
    if (reduced[static_cast<size_t>(d)]) {
      reduced_dims.push_back(d);
      plan.r *= x.size(d);
      if (keepdim) plan.out_shape.push_back(1);
    } else {
      kept_dims.push_back(d);
      plan.outer *= x.size(d);
      plan.out_shape.push_back(x.size(d));
    }
  }
  std::vector<int64_t> order = kept_dims;
  order.insert(order.end(), reduced_dims.begin(), reduced_dims.end());
  const Tensor permuted = x.permute(order);
  if (permuted.is_contiguous()) {
    plan.x3 = permuted.view({plan.outer, plan.r, 1});
    return plan;
  }
  // Reduced dimensions that are consecutive (ignoring size-1 dims) reduce in place as the middle extent.
  int64_t first = -1, last = -1;
  bool consecutive = true;
  for (int64_t d = 0; d < rank; ++d) {
    if (!reduced[static_cast<size_t>(d)] || x.size(d) == 1) continue;
    if (first < 0) first = d;
    for (int64_t k = last + 1; last >= 0 && k < d; ++k)
      if (x.size(k) != 1) consecutive = false;
    last = d;
  }
  if (consecutive && first >= 0) {
    int64_t before = 1, after = 1;
    for (int64_t d = 0; d < first; ++d) before *= x.size(d);
    for (int64_t d = last + 1; d < rank; ++d) after *= x.size(d);
    plan.outer = before;
    plan.inner = after;
    plan.x3 = x.contiguous().view({before, plan.r, after});
    return plan;
  }
  plan.x3 = permuted.contiguous().view({plan.outer, plan.r, 1});
  return plan;
}

// Runs the kernel into a contiguous [outer, inner] buffer and returns it with the user-visible shape (built
// directly, since a 0-d result cannot be reached through view).
Tensor dispatch_reduction(const char* op, const ReducePlan& plan, DType out_dtype, runtime::Attrs attrs) {
  Tensor out = Tensor::empty({plan.outer, plan.inner}, out_dtype, plan.x3.device());
  runtime::dispatch(runtime::OpCall{op, {plan.x3}, {out}, std::move(attrs)});
  return Tensor(out.storage(), plan.out_shape, contiguous_strides(plan.out_shape), 0, out_dtype);
}

Tensor run_reduction(const char* op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim,
                     DType out_dtype, runtime::Attrs attrs = {}) {
  return dispatch_reduction(op, plan_reduction(x, dims, keepdim, op), out_dtype, std::move(attrs));
}

void check_floating(const Tensor& x, const char* op) {
  KILN_CHECK(x.defined() && is_floating(x.dtype()), op << ": expected a floating-point tensor, got "
                                                       << (x.defined() ? x.str() : "an undefined tensor"));
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  KILN_CHECK(x.defined(), "sum: input is an undefined tensor");
  return run_reduction("sum", x, dims, keepdim, is_floating(x.dtype()) ? x.dtype() : int64);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_floating(x, "mean");
  return run_reduction("mean", x, dims, keepdim, x.dtype());
}

Tensor max(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  ReducePlan plan = plan_reduction(x, dims, keepdim, "max");
  KILN_CHECK(plan.r > 0 || plan.outer * plan.inner == 0, "max: cannot reduce over an empty extent: input "
                                                             << shape_str(x.shape()) << ", dims "
                                                             << shape_str(dims));
  return dispatch_reduction("max", plan, x.dtype(), {});
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  check_floating(x, "var");
  KILN_CHECK(correction >= 0, "var: correction must be >= 0, got " << correction);
  return run_reduction("var", x, dims, keepdim, x.dtype(), runtime::Attrs().set("correction", correction));
}

}  // namespace kiln
