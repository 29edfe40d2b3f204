#include "dist/host_collectives.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include "dist/local_group.h"
#include "dist/transport.h"
#include "kiln/core/error.h"
#include "kiln/core/half.h"
#include "kiln/dist/process_group.h"

namespace kiln::dist {

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
std::vector<char> gather(const void* in, size_t bytes, const LocalRank* local) {
  if (!local) {
    std::vector<char> gathered(bytes * static_cast<size_t>(world_size()));
    all_gather_bytes(in, bytes, gathered.data());
    return gathered;
  }
  // The last rank to arrive copies every rank's bytes (all still waiting, their inputs alive) into one
  // buffer that each rank then reads.
  using Shared = std::shared_ptr<const std::vector<char>>;
  const std::any all = local->group->rendezvous(local->rank, in, [bytes](const std::vector<std::any>& items) {
    auto gathered = std::make_shared<std::vector<char>>(bytes * items.size());
    for (size_t r = 0; r < items.size(); ++r)
      std::memcpy(gathered->data() + r * bytes, std::any_cast<const void*>(items[r]), bytes);
    return std::vector<std::any>(items.size(), Shared(gathered));
  });
  return *std::any_cast<Shared>(all);
}

int64_t ranks_of(const LocalRank* local) {
  return local ? local->group->size() : world_size();
}

}  // namespace

void all_reduce_sum_host(const void* in, DType dtype, int64_t numel, void* out, const LocalRank* local) {
  const std::vector<char> gathered = gather(in, static_cast<size_t>(numel) * dtype_size(dtype), local);
  const int64_t ranks = ranks_of(local);
  switch (dtype) {
    case DType::Float32:
      sum_ranks(gathered.data(), ranks, numel, static_cast<float*>(out));
      break;
    case DType::BFloat16:
      sum_ranks(gathered.data(), ranks, numel, static_cast<bf16_t*>(out));
      break;
    case DType::Float16:
      sum_ranks(gathered.data(), ranks, numel, static_cast<f16_t*>(out));
      break;
    default:
      KILN_FAIL("all_reduce_sum: no kernel for dtype " << dtype_name(dtype)
                                                       << " (float32, bfloat16, float16)");
  }
}

void all_gather_host(const void* in, const Shape& shape, size_t element_size, int64_t dim, void* out,
                     const LocalRank* local) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * element_size;
  const std::vector<char> gathered = gather(in, bytes, local);
  // The input is [outer, extent, inner] around the gathered dimension; rank r's block goes to extent slot r.
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dim; ++i) outer *= shape[i];
  for (int64_t i = dim + 1; i < static_cast<int64_t>(shape.size()); ++i) inner *= shape[i];
  const size_t chunk = static_cast<size_t>(shape[dim] * inner) * element_size;
  const int64_t ranks = ranks_of(local);
  char* dst = static_cast<char*>(out);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < ranks; ++r)
      std::memcpy(dst + (o * ranks + r) * chunk, gathered.data() + r * bytes + o * chunk, chunk);
}

}  // namespace kiln::dist
