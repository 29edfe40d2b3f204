// Copies of a weight in a kernel's packed layout, made once and kept on the weight's Storage (its derived
// slots): oneDNN's matmul weights in the layout its primitive chose (onednn_util.cpp) and the AMX GEMM's
// tiles (amx_packed_weights.cpp). What both need is here once: the copy is keyed by the view (a fused qkv
// weight sliced three ways holds three copies), charged against the calling context's packed-weight budget,
// packed under a lock so that concurrent first calls do not pack (and hold) it twice, and afterwards the
// weight's own pages are dropped from memory where they came from a mapped file (every later call reads the
// copy).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "kiln/core/storage.h"
#include "kiln/core/tensor.h"
#include "kiln/runtime/execution_context.h"
#include "runtime/packed_weight_charge.h"

namespace kiln::cpu_kernels {

// Layout: what besides the view tells copies apart (equality-comparable). Packed: what a caller reads a copy
// through, made by the pack function from the copy's bytes.
template <class Layout, class Packed>
class PackedWeightCopies {
 public:
  // The layout of a copy of this view, if one was made.
  std::optional<Layout> layout_of(const Tensor& weight) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Entry& e : entries_)
      if (same_view(e, weight)) return e.layout;
    return std::nullopt;
  }

  // The copy of this view in `layout`; on first use `pack(void* dst)` fills `bytes` bytes of CPU memory
  // (counted by the CPU allocator) and returns its Packed. nullopt when a new copy would exceed the
  // packed-weight budget (kiln::set_packed_weight_budget): the caller then reads the weight as it is.
  template <class Pack>
  std::optional<Packed> get(const Tensor& weight, const Layout& layout, int64_t bytes, Pack&& pack) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Entry& e : entries_)
      if (same_view(e, weight) && e.layout == layout) return e.packed;
    runtime::PackedWeightCharge charge = current_context().memory().reserve_packed(bytes);
    if (!charge) return std::nullopt;
    auto storage = Storage::allocate(static_cast<size_t>(bytes), cpu, Storage::Lifetime::kLongLived);
    Packed packed = pack(storage->data());
    weight.storage()->drop_resident_pages();
    entries_.push_back({weight.offset(), weight.shape(), weight.strides(), weight.dtype(), layout,
                        std::move(storage), packed, std::move(charge)});
    return packed;
  }

 private:
  struct Entry {
    int64_t offset;
    Shape shape;
    Strides strides;
    DType dtype;
    Layout layout;
    std::shared_ptr<Storage> bytes;
    Packed packed;
    runtime::PackedWeightCharge charge;  // against the budget of the context that packed it
  };

  static bool same_view(const Entry& e, const Tensor& weight) {
    return e.offset == weight.offset() && e.shape == weight.shape() && e.strides == weight.strides() &&
           e.dtype == weight.dtype();
  }

  std::mutex mutex_;
  std::vector<Entry> entries_;
};

// The copies of `weight`'s Storage in one kind of layout (one derived slot per Layout and Packed pair).
template <class Layout, class Packed>
std::shared_ptr<PackedWeightCopies<Layout, Packed>> packed_weight_copies(const Tensor& weight) {
  using Copies = PackedWeightCopies<Layout, Packed>;
  return weight.storage()->derived<Copies>([] { return std::make_shared<Copies>(); });
}

}  // namespace kiln::cpu_kernels
