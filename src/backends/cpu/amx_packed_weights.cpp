#include "backends/cpu/amx_packed_weights.h"

#include <mutex>
#include <vector>

#include "backends/cpu/gemm_amx.h"
#include "kiln/core/storage.h"
#include "kiln/runtime/execution_context.h"
#include "runtime/packed_weight_charge.h"

namespace kiln::cpu_kernels {

namespace {

struct AmxPackedEntry {
  int64_t offset;
  Shape shape;
  Strides strides;
  std::shared_ptr<Storage> bytes;  // counted by the CPU allocator
  runtime::PackedWeightCharge charge;
};

// Lives in the weight Storage's derived slot; one per Storage (a fused qkv weight sliced three ways holds
// three entries).
class AmxPackedWeights {
 public:
  const uint16_t* get(const Tensor& weight) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const AmxPackedEntry& e : entries_) {
      if (e.offset == weight.offset() && e.shape == weight.shape() && e.strides == weight.strides())
        return static_cast<const uint16_t*>(e.bytes->data());
    }
    const int64_t n = weight.size(0), k = weight.size(1);
    const int64_t bytes = (n + 15) / 16 * 16 * k * 2;
    runtime::PackedWeightCharge charge = current_context().memory().reserve_packed(bytes);
    if (!charge) return nullptr;
    // Packed under the lock: concurrent first calls on one weight must not pack (and hold) it twice.
    auto storage = Storage::allocate(static_cast<size_t>(bytes), cpu);
    Bf16Gemm g;
    g.w = weight.raw_data();
    g.w_row_stride = weight.stride(0);
    g.w_col_stride = weight.stride(1);
    g.n = n;
    g.k = k;
    avx512::amx_pack_weights(g, 0, n, 0, k, static_cast<uint16_t*>(storage->data()));
    // Every later call reads the packed copy: a weight borrowed from a mapped checkpoint need not also stay
    // resident (it is read back from the file if anything touches it again).
    weight.storage()->drop_resident_pages();
    entries_.push_back({weight.offset(), weight.shape(), weight.strides(), storage, std::move(charge)});
    return static_cast<const uint16_t*>(storage->data());
  }

 private:
  std::mutex mutex_;
  std::vector<AmxPackedEntry> entries_;
};

}  // namespace

const uint16_t* amx_packed_weight(const Tensor& weight) {
  auto packs =
      weight.storage()->derived<AmxPackedWeights>([] { return std::make_shared<AmxPackedWeights>(); });
  return packs->get(weight);
}

}  // namespace kiln::cpu_kernels
