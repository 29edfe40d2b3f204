// Front ends of the collective ops: argument checks, output allocation, and the flag that keeps the graph
// passes from merging two identical calls (each rank must make every one).
#include "kiln/ops/collective.h"

#include "dist/local_group.h"
#include "kiln/dist/process_group.h"
#include "runtime/dispatcher.h"

namespace kiln {

namespace {

void check_float(const Tensor& x, const char* op) {
  KILN_CHECK(x.defined(), op << ": undefined tensor");
  KILN_CHECK(x.dtype() == float32 || x.dtype() == bfloat16 || x.dtype() == float16,
             op << ": " << x.str() << " has dtype " << dtype_name(x.dtype())
                << "; collectives take float32, bfloat16 or float16");
}

}  // namespace

Tensor all_reduce_sum(const Tensor& x) {
  check_float(x, "all_reduce_sum");
  if (dist::world_size() == 1) return x;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  runtime::OpCall call{"all_reduce_sum", {x.contiguous()}, {out}, {}, /*may_merge=*/false};
  dist::collective_attrs(call.attrs);
  runtime::dispatch(std::move(call));
  return out;
}

Tensor all_gather(const Tensor& x, int64_t dim) {
  check_float(x, "all_gather");
  const int64_t rank = static_cast<int64_t>(x.shape().size());
  KILN_CHECK(rank > 0, "all_gather: " << x.str() << " is a scalar; it has no dimension to gather along");
  const int64_t d = dim < 0 ? dim + rank : dim;
  KILN_CHECK(d >= 0 && d < rank, "all_gather: dimension " << dim << " is out of range for " << x.str());
  const int64_t n = dist::world_size();
  if (n == 1) return x;
  Shape shape = x.shape();
  shape[static_cast<size_t>(d)] *= n;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  runtime::OpCall call{"all_gather", {x.contiguous()}, {out}, {}, /*may_merge=*/false};
  dist::collective_attrs(call.attrs);
  call.attrs.set("dim", d);
  runtime::dispatch(std::move(call));
  return out;
}

}  // namespace kiln
