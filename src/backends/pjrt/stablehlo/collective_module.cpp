#include "backends/pjrt/stablehlo/collective_module.h"

#include "backends/pjrt/stablehlo/storage_views.h"
#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {

std::string collective_module(const runtime::OpCall& call, int64_t replicas, const ArrayDims& array_dims) {
  const Tensor& in = call.inputs.at(0);
  const Tensor& out = call.outputs.at(0);
  HloBuilder b("kiln_" + std::string(call.op));
  const Value x = load_view(b, b.parameter(in.dtype(), array_dims(in)), layout_of(in));
  Value y;
  if (call.op == "all_reduce_sum") {
    y = b.convert(b.all_reduce_sum(b.convert(x, DType::Float32), replicas), out.dtype());
  } else if (call.op == "all_gather") {
    y = b.all_gather(x, call.attrs.get_int("dim"), replicas);
  } else {
    KILN_FAIL("collective_module: " << call.op << " is not a collective (all_reduce_sum, all_gather)");
  }
  const ViewLayout out_layout = layout_of(out);
  KILN_CHECK(covers_whole_storage(out_layout, storage_elements(out)),
             "internal: " << call.op << "'s output " << out.str() << " does not cover its storage");
  return b.module_text({store_whole(b, y, out_layout)});
}

}  // namespace kiln::pjrt::hlo
