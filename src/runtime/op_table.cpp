#include "runtime/op_table.h"

#include <deque>
#include <mutex>

#include "kiln/core/error.h"
#include "runtime/elementwise_op.h"

namespace kiln::runtime {

namespace {

// Kiln's ops: data movement, then the elementwise ops (ops/elementwise.h; named in elementwise_op.h, the one
// place their names are spelled), then the rest. One line per family keeps the tables readable (clang-format
// would put one op a line).
// clang-format off
const OpInfo kDataMovementOps[] = {
    // between devices too
    {"copy"},
};
const OpInfo kOtherOps[] = {
    // reductions and normalisations (ops/reduction.h, ops/nn.h)
    {"sum"}, {"mean"}, {"max"}, {"var"}, {"softmax"}, {"layer_norm"}, {"rms_norm"}, {"group_norm"},
    // layout (ops/layout.h)
    {"concat"}, {"embedding"}, {"upsample_nearest2d"}, {"rope"}, {"flux_rope_tables"},
    // products (ops/linalg.h, ops/attention.h, ops/quantized_linear.h)
    {"linear"}, {"matmul"}, {"conv2d"}, {"scaled_dot_product_attention"}, {"linear_quantized"},
    // what the graph passes make of several ops (ops/fused.h)
    {"linear_fused"}, {"norm_modulate"},
    // collectives (ops/collective.h): every rank must make each call, so two are never merged
    {"all_reduce_sum", false}, {"all_gather", false},
};
// clang-format on

struct Table {
  std::mutex mutex;
  std::deque<OpInfo> ops;  // a deque: add_op never moves the entries find_op has handed out
};

Table& table() {
  static Table* t = [] {  // never destroyed: kernels may be registered and looked up during exit
    auto* made = new Table;
    made->ops.assign(std::begin(kDataMovementOps), std::end(kDataMovementOps));
    for (int i = 0; i < kEwOpCount; ++i) made->ops.push_back(OpInfo{ew_op_name(static_cast<EwOp>(i))});
    made->ops.insert(made->ops.end(), std::begin(kOtherOps), std::end(kOtherOps));
    return made;
  }();
  return *t;
}

}  // namespace

std::vector<OpInfo> op_table() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return {t.ops.begin(), t.ops.end()};
}

const OpInfo* find_op(std::string_view name) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (const OpInfo& op : t.ops)
    if (op.name == name) return &op;
  return nullptr;
}

void add_op(OpInfo op) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (const OpInfo& existing : t.ops)
    KILN_CHECK(existing.name != op.name, "add_op: an op named '" << op.name << "' exists already");
  t.ops.push_back(op);
}

}  // namespace kiln::runtime
