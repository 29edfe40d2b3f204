#include "kiln/nn/mapped_weights.h"

#include <algorithm>
#include <map>
#include <set>

#include "kiln/ops/layout.h"

namespace kiln::nn {

namespace {

using Entry = MappedWeights::Entry;

// Rows [begin, end) of `t`, halves swapped when asked; `rows` and `cat` slice and join T.
template <class T, class Rows, class Concat>
T select_rows(const T& t, const Entry& e, int64_t n0, Rows rows, Concat cat) {
  const int64_t end = e.end < 0 ? n0 : e.end;
  T r = rows(t, e.begin, end);
  if (!e.swap_halves) return r;
  const int64_t half = (end - e.begin) / 2;
  return cat(rows(r, half, end - e.begin), rows(r, 0, half));
}

}  // namespace

std::string MappedWeights::prefix_if_present(const WeightSource& w, const std::string& prefix) {
  for (const auto& n : w.names())
    if (n.rfind(prefix, 0) == 0) return prefix;
  return "";
}

MappedWeights::MappedWeights(std::shared_ptr<const WeightSource> inner, Mapping mapping, std::string prefix,
                             std::string layout)
    : inner_(std::move(inner)), entries_(std::move(mapping)), prefix_(std::move(prefix)) {
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::set<std::string> used;
  std::map<std::string, int64_t> split_rows;  // fused file tensor -> rows its splits cover
  for (const auto& [to, e] : entries_) {
    const std::string from = prefix_ + e.source;
    KILN_CHECK(inner_->contains(from), inner_->description() << ": the " << layout << " lacks tensor '"
                                                             << from << "' (needed for " << to << ")");
    const Shape s = inner_->shape(from);
    if (e.end >= 0) {
      KILN_CHECK(!s.empty() && s[0] >= e.end, inner_->description()
                                                  << ": tensor '" << from << "' has shape " << shape_str(s)
                                                  << ", too few rows for " << to << " (rows " << e.begin
                                                  << " to " << e.end << ")");
      split_rows[from] = std::max(split_rows[from], e.end);
    }
    if (e.swap_halves)
      KILN_CHECK(!s.empty() && s[0] % 2 == 0, inner_->description()
                                                  << ": tensor '" << from << "' has shape " << shape_str(s)
                                                  << ", which cannot be split in halves");
    used.insert(from);
  }
  // A fused tensor with more rows than its parts is a different architecture than the config describes.
  for (const auto& [from, rows] : split_rows) {
    const int64_t have = inner_->shape(from)[0];
    KILN_CHECK(have == rows, inner_->description() << ": tensor '" << from << "' has " << have
                                                   << " rows but the config expects " << rows);
  }
  for (const auto& n : inner_->names()) {
    if (used.count(n)) continue;
    if (!prefix_.empty() && n.rfind(prefix_, 0) != 0) continue;  // another component of the file
    unmapped_.push_back(n);
  }
}

const Entry& MappedWeights::entry(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const auto& e, const std::string& key) { return e.first < key; });
  KILN_CHECK(it != entries_.end() && it->first == name, description()
                                                            << ": no tensor maps to '" << name << "'");
  return it->second;
}

bool MappedWeights::contains(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const auto& e, const std::string& key) { return e.first < key; });
  return it != entries_.end() && it->first == name;
}

Shape MappedWeights::shape(const std::string& name) const {
  const Entry& e = entry(name);
  Shape s = inner_->shape(prefix_ + e.source);
  if (e.end >= 0) s[0] = e.end - e.begin;
  return s;
}

Tensor MappedWeights::load(const std::string& name) const {
  const Entry& e = entry(name);
  const Tensor t = inner_->load(prefix_ + e.source);
  return select_rows(
      t, e, t.size(0), [](const Tensor& x, int64_t b, int64_t end) { return x.narrow(0, b, end - b); },
      [](const Tensor& a, const Tensor& b) {
        return concat({a, b}, 0);
      });
}

quant::QuantizedTensor MappedWeights::load_quantized(const std::string& name) const {
  const Entry& e = entry(name);
  const quant::QuantizedTensor q = inner_->load_quantized(prefix_ + e.source);
  if (!q.defined()) return q;
  return select_rows(
      q, e, q.shape[0],
      [](const quant::QuantizedTensor& x, int64_t b, int64_t end) { return x.rows(b, end); },
      [](const quant::QuantizedTensor& a, const quant::QuantizedTensor& b) {
        Shape shape = a.shape;
        shape[0] += b.shape[0];
        return quant::QuantizedTensor{concat({a.blocks, b.blocks}, 0), a.type, shape};
      });
}

std::vector<std::string> MappedWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [to, e] : entries_) out.push_back(to);
  out.insert(out.end(), unmapped_.begin(), unmapped_.end());
  return out;
}

}  // namespace kiln::nn
