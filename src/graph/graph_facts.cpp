#include "graph/graph_facts.h"

namespace kiln::graph {

Facts gather_facts(const std::vector<runtime::OpCall>& calls, const std::vector<const Storage*>& keep) {
  Facts facts;
  for (size_t i = 0; i < calls.size(); ++i) {
    const runtime::OpCall& c = calls[i];
    for (const Tensor& t : c.inputs) {
      if (!t.defined()) continue;
      auto [it, inserted] = facts.try_emplace(sid(t));
      it->second.graph_refs++;
      if (it->second.readers.empty() || it->second.readers.back() != static_cast<int>(i))
        it->second.readers.push_back(static_cast<int>(i));
    }
    for (const Tensor& t : c.outputs) {
      if (!t.defined()) continue;
      auto [it, inserted] = facts.try_emplace(sid(t));
      if (inserted) it->second.fresh = !t.storage()->is_allocated();
      it->second.graph_refs++;
      it->second.writers.push_back(static_cast<int>(i));
    }
  }
  // use_count counts every shared_ptr to the storage; those beyond the graph's own are held by the program.
  for (const runtime::OpCall& c : calls) {
    for (const auto* list : {&c.inputs, &c.outputs})
      for (const Tensor& t : *list) {
        if (!t.defined()) continue;
        StorageFacts& f = facts[sid(t)];
        f.external = f.external || t.storage().use_count() > f.graph_refs;
      }
  }
  for (const Storage* s : keep) {
    auto it = facts.find(s);
    if (it != facts.end()) it->second.external = true;
  }
  return facts;
}

bool is_private(const Facts& facts, const Tensor& t, int writer) {
  if (!t.defined()) return false;
  auto it = facts.find(sid(t));
  if (it == facts.end()) return false;
  const StorageFacts& f = it->second;
  return f.fresh && !f.external && f.writers.size() == 1 && f.writers[0] == writer;
}

bool same_view(const Tensor& a, const Tensor& b) {
  return sid(a) == sid(b) && a.offset() == b.offset() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         a.strides() == b.strides();
}

bool written_between(const Facts& facts, const std::vector<Tensor>& tensors, int from, int to) {
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    auto it = facts.find(sid(t));
    if (it == facts.end()) continue;
    for (int w : it->second.writers)
      if (w > from && w < to) return true;
  }
  return false;
}

}  // namespace kiln::graph
