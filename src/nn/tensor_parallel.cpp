#include "kiln/nn/tensor_parallel.h"

#include "kiln/core/error.h"

namespace kiln::nn {

int64_t TensorParallel::split(int64_t n, const std::string& what) const {
  KILN_CHECK(size > 0 && n % size == 0, "tensor parallelism: " << what << " (" << n
                                                               << ") is not divisible by the tensor-parallel "
                                                                  "degree "
                                                               << size
                                                               << "; choose a degree that divides it");
  return n / size;
}

std::vector<std::pair<int64_t, int64_t>> ParameterShard::ranges() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t offset = 0;
  for (int64_t block : blocks) {
    const int64_t part = tp.split(block, "a weight block of " + std::to_string(block) + " features");
    out.emplace_back(offset + tp.rank * part, offset + (tp.rank + 1) * part);
    offset += block;
  }
  return out;
}

int64_t ParameterShard::local_extent() const {
  int64_t n = 0;
  for (const auto& [start, end] : ranges()) n += end - start;
  return n;
}

}  // namespace kiln::nn
