// OpCall: one invocation of an op — its name, input and output tensors and attributes — as the runtime
// hands it to a backend kernel. Ops (src/ops) validate arguments, infer output shapes, allocate outputs and
// build an OpCall; kernels (src/backends/*) only compute. Keeping the call a plain value is what lets the
// execution modes record, reorder and fuse calls instead of running them at once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln::runtime {

using AttrValue = std::variant<int64_t, double, bool, std::vector<int64_t>, std::string>;

class Attrs {
 public:
  // Not inlined: inlined into a caller that sets an integer, GCC 12 warns (falsely) that the vector
  // alternative may be used uninitialized when the items grow.
  [[gnu::noinline]] Attrs& set(std::string_view name, AttrValue value) {
    items_.emplace_back(name, std::move(value));
    return *this;
  }
  int64_t get_int(std::string_view name) const { return std::get<int64_t>(find(name)); }
  double get_float(std::string_view name) const { return std::get<double>(find(name)); }
  bool get_bool(std::string_view name) const { return std::get<bool>(find(name)); }
  const std::vector<int64_t>& get_ints(std::string_view name) const {
    return std::get<std::vector<int64_t>>(find(name));
  }
  const std::string& get_string(std::string_view name) const { return std::get<std::string>(find(name)); }
  bool has(std::string_view name) const {
    for (const auto& [k, v] : items_)
      if (k == name) return true;
    return false;
  }
  const std::vector<std::pair<std::string_view, AttrValue>>& items() const { return items_; }

 private:
  const AttrValue& find(std::string_view name) const {
    for (const auto& [k, v] : items_)
      if (k == name) return v;
    KILN_FAIL("internal: op attribute '" << name << "' missing");
  }
  // Names are string literals owned by the op code, so a view is enough.
  std::vector<std::pair<std::string_view, AttrValue>> items_;
};

struct OpCall {
  std::string_view op;  // a string literal such as "add"
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  Attrs attrs;
  // False for ops with effects beyond their outputs (collectives: every rank must make each call), which the
  // graph passes must never merge with an identical call.
  bool may_merge = true;

  // "add(float32[2, 3], float32[3]) -> float32[2, 3]", used in errors raised while the op runs.
  std::string describe() const;
};

}  // namespace kiln::runtime
