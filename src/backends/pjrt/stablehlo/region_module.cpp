#include "backends/pjrt/stablehlo/region_module.h"

#include <optional>
#include <unordered_map>

#include "backends/pjrt/stablehlo/op_lowering.h"
#include "backends/pjrt/stablehlo/storage_views.h"
#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {

namespace {

bool same_layout(const ViewLayout& a, const ViewLayout& b) {
  return a.shape == b.shape && a.strides == b.strides && a.offset == b.offset;
}

// What the module holds for one storage at a point of the region.
struct StorageValue {
  DType dtype;
  int64_t elements = 0;
  // The storage's array, when known as one (a parameter, or after a partial write).
  std::optional<Value> array;
  // The value last written over the whole storage through `layout`, not yet laid out as the array: reads
  // through the same view take it as it is, so a chain of whole tensors never goes through reshapes.
  std::optional<Value> whole;
  ViewLayout layout;
  int64_t result = -1;  // index into the results when stored
};

class RegionBuilder {
 public:
  RegionBuilder(const runtime::DeviceRegion& region, const LoweringTarget& target,
                const ArrayDims& array_dims)
      : region_(region), array_dims_(array_dims), b_("kiln_region", target) {
    b_.lift_scalars();
  }

  RegionModule build() {
    std::vector<const Storage*> stored_order;
    for (size_t i = 0; i < region_.calls.size(); ++i) {
      const runtime::OpCall& call = region_.calls[i];
      KILN_CHECK(has_lowering(call.op), "PJRT: op '" << call.op << "' has no StableHLO lowering ("
                                                     << call.describe() << "); it cannot join a region");
      std::vector<Value> inputs;
      for (size_t k = 0; k < call.inputs.size(); ++k)
        inputs.push_back(call.inputs[k].defined() ? read(i, k) : Value{});
      const std::vector<Value> values = lower_op(b_, call, inputs);
      for (size_t o = 0; o < call.outputs.size(); ++o) {
        write(i, o, values[o]);
        StorageValue& s = storages_.at(call.outputs[o].storage().get());
        if (region_.stored[i][o] && s.result < 0) {
          s.result = static_cast<int64_t>(m_.results.size());
          m_.results.push_back({static_cast<int64_t>(i), true, static_cast<int64_t>(o)});
          stored_order.push_back(call.outputs[o].storage().get());
        }
      }
    }
    std::vector<Value> results;
    for (const Storage* s : stored_order) results.push_back(array_of(storages_.at(s)));
    m_.text = b_.module_text(results);
    // Storages and lifted scalars in @main's order.
    std::vector<RegionModule::Param> params(static_cast<size_t>(b_.num_parameters()));
    for (size_t k = 0; k < m_.params.size(); ++k)
      params[static_cast<size_t>(storage_param_numbers_[k])] = m_.params[k];
    for (const HloBuilder::LiftedScalar& s : b_.lifted_scalars())
      params[static_cast<size_t>(s.parameter)] = {{}, s.dtype, {}, true, s.value};
    m_.params = std::move(params);
    return std::move(m_);
  }

 private:
  StorageValue& state_for(const Tensor& t, const runtime::OpCall& call) {
    auto [it, inserted] = storages_.try_emplace(t.storage().get());
    if (inserted) {
      it->second.dtype = t.dtype();
      it->second.elements = storage_elements(t);
    }
    KILN_CHECK(it->second.dtype == t.dtype(),
               call.describe() << " uses " << t.str() << " of a storage the region holds as "
                               << dtype_name(it->second.dtype)
                               << ": reinterpreting a storage's bytes as another dtype is not supported on "
                                  "PJRT devices");
    return it->second;
  }

  Value new_param(StorageValue& s, const Tensor& t, size_t call, bool output, size_t operand) {
    const Shape dims = array_dims_(t);
    m_.params.push_back({{static_cast<int64_t>(call), output, static_cast<int64_t>(operand)}, s.dtype, dims});
    const Value p = b_.parameter(s.dtype, dims);
    storage_param_numbers_.push_back(b_.num_parameters() - 1);
    return p;
  }

  Value array_of(StorageValue& s) {
    if (!s.array) s.array = store_whole(b_, *s.whole, s.layout);
    return *s.array;
  }

  Value read(size_t i, size_t k) {
    const runtime::OpCall& call = region_.calls[i];
    const Tensor& t = call.inputs[k];
    StorageValue& s = state_for(t, call);
    const ViewLayout layout = layout_of(t);
    if (s.whole && same_layout(s.layout, layout)) return *s.whole;
    if (!s.array && !s.whole) s.array = new_param(s, t, i, false, k);
    return load_view(b_, array_of(s), layout);
  }

  void write(size_t i, size_t o, const Value& value) {
    const runtime::OpCall& call = region_.calls[i];
    const Tensor& t = call.outputs[o];
    StorageValue& s = state_for(t, call);
    const ViewLayout layout = layout_of(t);
    if (covers_whole_storage(layout, s.elements)) {
      s.whole = value;
      s.layout = layout;
      s.array.reset();
      return;
    }
    if (!s.array && !s.whole) s.array = new_param(s, t, i, true, o);
    s.array = store_view(b_, array_of(s), value, layout);
    s.whole.reset();
  }

  const runtime::DeviceRegion& region_;
  const ArrayDims& array_dims_;
  HloBuilder b_;
  RegionModule m_;
  std::unordered_map<const Storage*, StorageValue> storages_;
  std::vector<int64_t> storage_param_numbers_;  // per storage parameter in m_.params: its @main number
};

}  // namespace

RegionModule region_module(const runtime::DeviceRegion& region, const LoweringTarget& target,
                           const ArrayDims& array_dims) {
  KILN_CHECK(!region.calls.empty() && region.stored.size() == region.calls.size(),
             "internal: a region needs calls and one stored list per call");
  return RegionBuilder(region, target, array_dims).build();
}

}  // namespace kiln::pjrt::hlo
