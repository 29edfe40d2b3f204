// "all_reduce_sum" and "all_gather" on CPU: one MPI all-gather of the contiguous input (dist/transport.h),
// then a sum in rank order or a reassembly along the gathered dimension. Gathering then summing locally
// (rather than MPI_Allreduce) gives every rank the same bits whatever MPI's algorithm, and handles bfloat16,
// which MPI has no type for; for the 2-8 ranks of tensor parallelism the bytes moved are of the same order.
#include <cstring>
#include <vector>

#include "backends/cpu/register_kernels.h"
#include "dist/transport.h"
#include "kiln/core/half.h"
#include "kiln/dist/process_group.h"

namespace kiln::cpu_kernels {

namespace {

template <class T>
float load_float(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return p[i];
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    return bf16_to_f32(p[i]);
  } else {
    return f16_to_f32(p[i]);
  }
}

template <class T>
T store_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    return f32_to_bf16(v);
  } else {
    return f32_to_f16(v);
  }
}

template <class T>
void sum_ranks(const char* gathered, int64_t ranks, int64_t n, T* out) {
  const T* parts = reinterpret_cast<const T*>(gathered);
  for (int64_t i = 0; i < n; ++i) {
    float sum = load_float(parts, i);
    for (int64_t r = 1; r < ranks; ++r) sum += load_float(parts + r * n, i);
    out[i] = store_float<T>(sum);
  }
}

// The input and output may share memory (a compiled program's arena reuses dead buffers), so the input is
// gathered into a scratch buffer before the output is written.
std::vector<char> gather_input(const Tensor& x) {
  const size_t bytes = x.nbytes();
  std::vector<char> gathered(bytes * static_cast<size_t>(dist::world_size()));
  dist::all_gather_bytes(x.raw_data(), bytes, gathered.data());
  return gathered;
}

void all_reduce_sum_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& out = call.outputs[0];
  const std::vector<char> gathered = gather_input(x);
  const int64_t n = x.numel(), ranks = dist::world_size();
  switch (x.dtype()) {
    case DType::Float32:
      sum_ranks(gathered.data(), ranks, n, static_cast<float*>(out.raw_data()));
      break;
    case DType::BFloat16:
      sum_ranks(gathered.data(), ranks, n, static_cast<bf16_t*>(out.raw_data()));
      break;
    case DType::Float16:
      sum_ranks(gathered.data(), ranks, n, static_cast<f16_t*>(out.raw_data()));
      break;
    default:
      KILN_FAIL("all_reduce_sum: no CPU kernel for dtype " << dtype_name(x.dtype()));
  }
}

void all_gather_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& out = call.outputs[0];
  const std::vector<char> gathered = gather_input(x);
  // x is [outer, extent, inner] around the gathered dimension; rank r's block goes to extent slot r.
  const int64_t d = call.attrs.get_int("dim");
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= x.size(i);
  for (int64_t i = d + 1; i < static_cast<int64_t>(x.shape().size()); ++i) inner *= x.size(i);
  const size_t chunk = static_cast<size_t>(x.size(d) * inner) * x.element_size();
  const int64_t ranks = dist::world_size();
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < ranks; ++r)
      std::memcpy(dst + (o * ranks + r) * chunk, gathered.data() + r * x.nbytes() + o * chunk, chunk);
}

}  // namespace

void register_collective_kernels(runtime::KernelRegistry& registry) {
  registry.add("all_reduce_sum", DeviceType::CPU, all_reduce_sum_kernel);
  registry.add("all_gather", DeviceType::CPU, all_gather_kernel);
}

}  // namespace kiln::cpu_kernels
