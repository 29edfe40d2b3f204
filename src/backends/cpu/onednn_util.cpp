#include "backends/cpu/onednn_util.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/packed_weight_copies.h"
#include "kiln/core/error.h"

namespace kiln::cpu_kernels::onednn {

const dnnl::engine& engine() {
  static const dnnl::engine cpu_engine = [] {
    // KILN_CPU_ISA=avx512 keeps AMX tiles out of oneDNN's kernels too (cpu_features.h; "generic" concerns
    // Kiln's own kernels only). It must be said before oneDNN first looks at the CPU, which creating the
    // engine does; a refusal (oneDNN already in use elsewhere in the process) leaves oneDNN's own choice.
    if (use_avx512() && !amx_allowed_by_isa()) {
      try {
        dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_bf16);
      } catch (const dnnl::error&) {
      }
    }
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return cpu_engine;
}

dnnl::memory::data_type data_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::Float32:
      return dnnl::memory::data_type::f32;
    case DType::BFloat16:
      return dnnl::memory::data_type::bf16;
    case DType::Float16:
      return dnnl::memory::data_type::f16;
    default:
      break;
  }
  KILN_FAIL(op << ": dtype " << dtype_name(dtype)
               << " is not supported (expected float32, bfloat16 or float16)");
}

dnnl::memory::desc plain_desc(const Shape& shape, const Strides& strides, DType dtype, const char* op) {
  KILN_CHECK(shape.size() <= DNNL_MAX_NDIMS,
             op << ": at most " << DNNL_MAX_NDIMS << " dims are supported, got " << shape_str(shape));
  int64_t span = 1;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] > 1) span = std::max(span, strides[i] * shape[i]);
  Strides canonical = strides;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == 1) canonical[i] = span;
  return dnnl::memory::desc(shape, data_type(dtype, op), canonical);
}

dnnl::memory::desc plain_desc(const Tensor& t, const char* op) {
  return plain_desc(t.shape(), t.strides(), t.dtype(), op);
}

dnnl::memory::desc dense_desc(const Shape& shape, dnnl::memory::data_type dt) {
  Strides strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return dnnl::memory::desc(shape, dt, strides);
}

KeyBuilder& KeyBuilder::add(int64_t v) {
  key_ += '|';
  key_ += std::to_string(v);
  return *this;
}

KeyBuilder& KeyBuilder::add(const std::vector<int64_t>& v) {
  key_ += '[';
  for (int64_t x : v) {
    key_ += std::to_string(x);
    key_ += ',';
  }
  key_ += ']';
  return *this;
}

KeyBuilder& KeyBuilder::add(const dnnl::memory::desc& md) {
  // Field by field rather than the struct's bytes: padding and unused union members are not guaranteed
  // to be zero, and two equal descriptors must give one key.
  const dnnl_memory_desc_t& d = md.data;
  key_ += '#';
  add(d.ndims).add(static_cast<int64_t>(d.data_type)).add(static_cast<int64_t>(d.format_kind)).add(d.offset0);
  for (int i = 0; i < d.ndims; ++i) add(d.dims[i]).add(d.padded_dims[i]).add(d.padded_offsets[i]);
  if (d.format_kind == dnnl_blocked) {
    const dnnl_blocking_desc_t& b = d.format_desc.blocking;
    for (int i = 0; i < d.ndims; ++i) add(b.strides[i]);
    add(b.inner_nblks);
    for (int i = 0; i < b.inner_nblks; ++i) add(b.inner_blks[i]).add(b.inner_idxs[i]);
  }
  add(static_cast<int64_t>(d.extra.flags)).add(d.extra.compensation_mask);
  return *this;
}

dnnl::primitive_attr default_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

namespace {

// Grows to the largest scratchpad this thread has needed; 64-byte aligned as oneDNN expects.
class Scratchpad {
 public:
  ~Scratchpad() { std::free(data_); }
  void* get(size_t bytes) {
    if (bytes > capacity_) {
      std::free(data_);
      capacity_ = (bytes + 4095) / 4096 * 4096;
      data_ = std::aligned_alloc(64, capacity_);
      KILN_CHECK(data_ != nullptr, "onednn: out of memory allocating a " << bytes << "-byte scratchpad");
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(engine());
  return stream;
}

}  // namespace

void execute(const dnnl::primitive& primitive, const dnnl::primitive_desc_base& pd,
             std::unordered_map<int, dnnl::memory> args) {
  thread_local Scratchpad scratchpad;
  const dnnl::memory::desc scratch_md = pd.scratchpad_desc();
  const size_t scratch_bytes = scratch_md.get_size();
  if (scratch_bytes > 0) {
    args.insert({DNNL_ARG_SCRATCHPAD, dnnl::memory(scratch_md, engine(), scratchpad.get(scratch_bytes))});
  }
  dnnl::stream& stream = thread_stream();
  primitive.execute(stream, args);
  stream.wait();
}

dnnl::memory::data_type compute_type(DType dtype) {
  return dtype == bfloat16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

Operand operand(const Tensor& t, const Shape& shape, const Strides& strides, const char* op) {
  const dnnl::memory::desc md = plain_desc(shape, strides, t.dtype(), op);
  dnnl::memory src(md, engine(), t.raw_data());
  if (t.dtype() != float16) return {md, src, {}};
  Tensor copy = Tensor::empty(shape, float32);
  const dnnl::memory::desc dense = dense_desc(shape, dnnl::memory::data_type::f32);
  dnnl::memory dst(dense, engine(), copy.raw_data());
  reorder(src, dst);
  return {dense, dst, copy};
}

Operand operand(const Tensor& t, const char* op) {
  return operand(t, t.shape(), t.strides(), op);
}

void reorder(const dnnl::memory& src, const dnnl::memory& dst) {
  const dnnl::memory::desc src_md = src.get_desc();
  const dnnl::memory::desc dst_md = dst.get_desc();
  const std::string key = KeyBuilder("reorder").add(src_md).add(dst_md).str();
  auto cached = PrimitiveCache<dnnl::reorder>::get(
      key, [&] { return dnnl::reorder::primitive_desc(engine(), src_md, engine(), dst_md, default_attr()); });
  execute(cached->primitive, cached->pd, {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}});
}

namespace {

// A weight's copies in the layouts oneDNN's primitives chose, each read through its dnnl::memory.
std::shared_ptr<PackedWeightCopies<dnnl::memory::desc, dnnl::memory>> packed_copies(const Tensor& weight) {
  return packed_weight_copies<dnnl::memory::desc, dnnl::memory>(weight);
}

}  // namespace

std::optional<dnnl::memory> packed_weight(const Tensor& weight, const dnnl::memory::desc& source_desc,
                                          const dnnl::memory::desc& target_desc) {
  return packed_copies(weight)->get(weight, target_desc, static_cast<int64_t>(target_desc.get_size()),
                                    [&](void* dst) {
                                      dnnl::memory packed(target_desc, engine(), dst);
                                      reorder(dnnl::memory(source_desc, engine(), weight.raw_data()), packed);
                                      return packed;
                                    });
}

std::optional<dnnl::memory::desc> packed_layout(const Tensor& weight) {
  return packed_copies(weight)->layout_of(weight);
}

bool is_reference_impl(const dnnl::primitive_desc_base& pd) {
  return std::strncmp(pd.impl_info_str(), "ref", 3) == 0;
}

MatmulWithWeight matmul_with_weight(
    const Tensor& w, const dnnl::memory::desc& w_plain, bool pack, dnnl::memory::data_type compute,
    const std::function<std::string(const dnnl::memory::desc&)>& key_for,
    const std::function<dnnl::matmul::primitive_desc(const dnnl::memory::desc&)>& make_pd) {
  const auto primitive_for = [&](const dnnl::memory::desc& w_md) {
    return PrimitiveCache<dnnl::matmul>::get(key_for(w_md), [&] { return make_pd(w_md); });
  };
  const auto in_place = [&] {
    return MatmulWithWeight{primitive_for(w_plain), dnnl::memory(w_plain, engine(), w.raw_data())};
  };
  if (!pack) return in_place();
  if (const std::optional<dnnl::memory::desc> layout = packed_layout(w)) {
    auto cached = primitive_for(*layout);
    if (is_reference_impl(cached->pd)) return in_place();
    return {cached, *packed_weight(w, w_plain, *layout)};
  }
  auto cached = primitive_for(dnnl::memory::desc(w_plain.dims(), compute, dnnl::memory::format_tag::any));
  if (std::optional<dnnl::memory> packed = packed_weight(w, w_plain, cached->pd.weights_desc()))
    return {cached, *packed};
  return in_place();  // over the packed-weight budget
}

}  // namespace kiln::cpu_kernels::onednn
