// What the oneDNN-backed kernels (matmul.cpp, conv.cpp) share: the one CPU engine, Kiln <-> oneDNN
// memory descriptors, a thread-safe primitive cache, per-thread scratchpads, and the cache of weights
// reordered once into the layout a primitive prefers (kept on the weight's Storage).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::cpu_kernels::onednn {

// One CPU engine per process (created on first use).
const dnnl::engine& engine();

// oneDNN's type for a Kiln dtype; throws kiln::Error naming `op` for types oneDNN cannot compute in.
dnnl::memory::data_type data_type(DType dtype, const char* op);

// Descriptor of a strided Kiln view (dims = shape, strides in elements). The stride of a size-1 dim does
// not affect addressing, so it is replaced by the span of the other dims: oneDNN then recognises the
// layout as a plain one (row-major "ab" or transposed "ba") and picks its fast kernels.
dnnl::memory::desc plain_desc(const Shape& shape, const Strides& strides, DType dtype, const char* op);
dnnl::memory::desc plain_desc(const Tensor& t, const char* op);
// Dense row-major descriptor.
dnnl::memory::desc dense_desc(const Shape& shape, dnnl::memory::data_type dt);

// Appends the fields that make a primitive unique to a cache key.
class KeyBuilder {
 public:
  explicit KeyBuilder(std::string_view kind) : key_(kind) {}
  KeyBuilder& add(int64_t v);
  KeyBuilder& add(const std::vector<int64_t>& v);
  KeyBuilder& add(const dnnl::memory::desc& md);
  const std::string& str() const { return key_; }

 private:
  std::string key_;
};

// A primitive with its descriptor, as the cache hands it out (immutable once created, so many threads
// may execute it at once: every primitive is created with a user-managed scratchpad, see Scratchpad).
template <class Primitive>
struct CachedPrimitive {
  typename Primitive::primitive_desc pd;
  Primitive primitive;
};

// Creating a primitive descriptor and primitive costs 0.05-5 ms (kernel selection and JIT); a DiT step
// calls the same few shapes thousands of times, so they are kept by key. The cache is bounded: when it
// holds `kCapacity` entries it is emptied, which only costs re-creation (shapes that vary without end,
// such as a growing sequence, must not grow memory without end).
template <class Primitive>
class PrimitiveCache {
 public:
  static constexpr size_t kCapacity = 2048;

  static std::shared_ptr<const CachedPrimitive<Primitive>> get(
      const std::string& key, const std::function<typename Primitive::primitive_desc()>& make_pd) {
    static std::mutex mutex;
    static std::unordered_map<std::string, std::shared_ptr<const CachedPrimitive<Primitive>>> entries;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = entries.find(key);
      if (it != entries.end()) return it->second;
    }
    // Created outside the lock: JIT compilation must not serialise unrelated shapes. Two threads racing on
    // one key both build it; the first insert wins and both results are equivalent.
    auto pd = make_pd();
    auto made =
        std::make_shared<const CachedPrimitive<Primitive>>(CachedPrimitive<Primitive>{pd, Primitive(pd)});
    std::lock_guard<std::mutex> lock(mutex);
    if (entries.size() >= kCapacity) entries.clear();
    return entries.emplace(key, std::move(made)).first->second;
  }
};

// Primitive attributes every Kiln primitive uses: a user scratchpad, so that concurrent executions of one
// cached primitive never share the library's global scratchpad.
dnnl::primitive_attr default_attr();

// Runs `primitive` on this thread's stream with a scratchpad of this thread, and waits for it.
void execute(const dnnl::primitive& primitive, const dnnl::primitive_desc_base& pd,
             std::unordered_map<int, dnnl::memory> args);

// Copies `src` memory to `dst` memory (any layouts / data types oneDNN can reorder between).
void reorder(const dnnl::memory& src, const dnnl::memory& dst);

// The type matmuls compute in: bfloat16 as is; float16 has no oneDNN kernels on this CPU and float32 is
// float32, so both compute in float32.
dnnl::memory::data_type compute_type(DType dtype);

// A matmul operand as oneDNN memory: `t` in place with the given shape and strides, or (float16) converted
// into a dense float32 copy that `holder` keeps alive. `op` names the op in errors.
struct Operand {
  dnnl::memory::desc desc;
  dnnl::memory mem;
  Tensor holder;
};
Operand operand(const Tensor& t, const Shape& shape, const Strides& strides, const char* op);
Operand operand(const Tensor& t, const char* op);

// A weight reordered once into a primitive's preferred layout (and compute type), cached on the weight's
// Storage and keyed by the view (offset, shape, strides, dtype) and the target descriptor, so one Storage
// may serve several views (a fused qkv weight sliced three ways). std::nullopt when a new copy would exceed
// the packed-weight budget (kiln::set_packed_weight_budget): the caller then reads the weight in place.
std::optional<dnnl::memory> packed_weight(const Tensor& weight, const dnnl::memory::desc& source_desc,
                                          const dnnl::memory::desc& target_desc);

// The layout this view of `weight` was packed in, if it has been packed.
//
// One packed copy per weight: the first consumer of a weight creates its primitive with format `any` and
// packs the weight into the layout that primitive prefers; every later consumer (linear, linear_fused with
// any post-ops, any M; conv2d at any image size) asks for that same layout instead of its own preference.
// oneDNN's preference depends on the ISA, the post-ops and the shapes (with AMX, oneDNN 2.6 picks BA16a64b2a
// for a plain matmul and BA16a48b2a for one with post-ops), so letting each consumer choose would pack a
// weight once per distinct preference.
std::optional<dnnl::memory::desc> packed_layout(const Tensor& weight);

// Whether a primitive descriptor fell back to oneDNN's reference (scalar) kernels: a consumer asking for an
// existing packed layout that the fast kernels cannot read then reads the weight in place instead.
bool is_reference_impl(const dnnl::primitive_desc_base& pd);

// A matmul primitive over weight `w` ([K, N] as `w_plain` describes it) and the weight memory to run it
// with: the packed copy (packed once, in the layout the weight's first consumer chose; see packed_layout)
// when `pack` and the budget allows, else the weight in place. `key_for(w_md)` is the primitive's cache key
// and `make_pd(w_md)` creates it, both for a given weight descriptor.
struct MatmulWithWeight {
  std::shared_ptr<const CachedPrimitive<dnnl::matmul>> cached;
  dnnl::memory weights;
};
MatmulWithWeight matmul_with_weight(
    const Tensor& w, const dnnl::memory::desc& w_plain, bool pack, dnnl::memory::data_type compute,
    const std::function<std::string(const dnnl::memory::desc&)>& key_for,
    const std::function<dnnl::matmul::primitive_desc(const dnnl::memory::desc&)>& make_pd);

}  // namespace kiln::cpu_kernels::onednn
