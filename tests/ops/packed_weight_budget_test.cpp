// The packed-weight budget (kiln::set_packed_weight_budget): packed copies are anonymous memory, so past the
// budget a weight is read in place from its memory-mapped checkpoint instead; the process's anonymous memory
// follows the budget, not the model, and the products do not change (issue #18).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backends/cpu/matmul_path.h"
#include "kiln/core/device_runtime.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::all_close;
using testing::process_status_bytes;
using testing::temp_dir;
using testing::values;

constexpr int64_t kOut = 2048, kIn = 4096;  // a 16 MiB bfloat16 weight
constexpr int64_t kWeightBytes = 2 * kOut * kIn;
constexpr int kWeights = 4;

// Sets the budget and the Always prepacking policy for one test, and restores both.
class BudgetScope {
 public:
  explicit BudgetScope(std::optional<int64_t> budget)
      : budget_(packed_weight_budget()), prepacking_(weight_prepacking()) {
    set_packed_weight_budget(budget);
    set_weight_prepacking(WeightPrepacking::Always);
  }
  ~BudgetScope() {
    set_packed_weight_budget(budget_);
    set_weight_prepacking(prepacking_);
  }

 private:
  std::optional<int64_t> budget_;
  WeightPrepacking prepacking_;
};

// kWeights mapped bf16 weights of kWeightBytes each, and the products x @ w^T computed with no packing.
struct MappedWeights {
  std::unique_ptr<io::SafetensorsFile> file;
  std::vector<Tensor> weights, expected;
  Tensor x = values({8, kIn}, 1, -1, 1, bfloat16);

  explicit MappedWeights(const std::string& name) {
    std::vector<std::pair<std::string, Tensor>> named;
    for (int i = 0; i < kWeights; ++i)
      named.emplace_back("w" + std::to_string(i), values({kOut, kIn}, 10 + i, -0.1, 0.1, bfloat16));
    const std::string path = temp_dir(name) + "/weights.safetensors";
    io::save_safetensors(path, named);
    file = std::make_unique<io::SafetensorsFile>(path);
    const WeightPrepacking before = weight_prepacking();
    set_weight_prepacking(WeightPrepacking::Never);
    for (int i = 0; i < kWeights; ++i) {
      weights.push_back(file->tensor("w" + std::to_string(i)));
      expected.push_back(linear(x, weights.back()).to(float32));
    }
    synchronize();
    set_weight_prepacking(before);
  }
};

TEST(PackedWeightBudget, AnonymousMemoryFollowsTheBudgetAndProductsDoNotChange) {
  // Packing is the oneDNN path's: on a host whose bf16 products run on f32 FMA (matmul_path.h) it is unused.
  const cpu_kernels::ScopedBf16Path onednn_path(cpu_kernels::Bf16Path::Onednn);
  MappedWeights m("packed_budget_rss");
  const int64_t budget = kWeightBytes + kWeightBytes / 4;  // room for one packed copy, not two
  BudgetScope scope(budget);
  // Warm-up on an owned weight of the same shape, outside the budget's reach once freed: oneDNN's primitives
  // and scratchpads exist before measuring.
  {
    const WeightPrepacking before = weight_prepacking();
    set_weight_prepacking(WeightPrepacking::Never);
    (void)linear(m.x, values({kOut, kIn}, 99, -0.1, 0.1, bfloat16)).to_vector<float>();
    set_weight_prepacking(before);
  }
  const int64_t packed_before = packed_weight_bytes();
  const double anon_before = process_status_bytes("RssAnon");
  std::vector<Tensor> got;
  for (const Tensor& w : m.weights) got.push_back(linear(m.x, w).to(float32));
  synchronize();
  const double anon_growth = process_status_bytes("RssAnon") - anon_before;

  EXPECT_GE(packed_weight_bytes() - packed_before, kWeightBytes);  // the first weight was packed...
  EXPECT_LE(packed_weight_bytes(), budget);                        // ...and no more than the budget holds
  // All four weights packed would add 64 MiB; one adds 16 MiB (plus a few MiB of allocator and outputs).
  EXPECT_LT(anon_growth, static_cast<double>(budget) + 4.0 * 1024 * 1024);
  for (int i = 0; i < kWeights; ++i)
    EXPECT_TRUE(all_close(got[i], m.expected[i], 1e-2, 1e-3)) << "weight " << i;
  // Later calls read the same way: the packed one from its copy, the rest in place.
  for (int i = 0; i < kWeights; ++i)
    EXPECT_TRUE(all_close(linear(m.x, m.weights[i]).to(float32), got[i], 0, 0));
}

TEST(PackedWeightBudget, NoLimitPacksEveryWeightAndFreeingThemReturnsTheBytes) {
  // Packing is the oneDNN path's: on a host whose bf16 products run on f32 FMA (matmul_path.h) it is unused.
  const cpu_kernels::ScopedBf16Path onednn_path(cpu_kernels::Bf16Path::Onednn);
  BudgetScope scope(std::nullopt);
  const int64_t packed_before = packed_weight_bytes();
  {
    MappedWeights m("packed_budget_all");
    for (const Tensor& w : m.weights) (void)linear(m.x, w).to_vector<float>();
    EXPECT_GE(packed_weight_bytes() - packed_before, kWeights * kWeightBytes);
  }
  synchronize();
  EXPECT_EQ(packed_weight_bytes(), packed_before);
}

TEST(PackedWeightBudget, ConvOverTheBudgetReordersPerCallWithTheSameResult) {
  const Tensor x = values({1, 16, 12, 12}, 3, -1, 1, bfloat16);
  const Tensor w = values({32, 16, 3, 3}, 4, -0.2, 0.2, bfloat16);
  Tensor packed_result;
  {
    BudgetScope scope(std::nullopt);
    packed_result = conv2d(x, w.clone(), {}, {1, 1}, {1, 1}).to(float32);
  }
  // The clone (and its packed copy) is freed once the queued convolution has run: counted before reading.
  synchronize();
  BudgetScope scope(0);
  const int64_t packed_before = packed_weight_bytes();
  const Tensor y = conv2d(x, w, {}, {1, 1}, {1, 1}).to(float32);
  synchronize();
  EXPECT_EQ(packed_weight_bytes(), packed_before);
  EXPECT_TRUE(all_close(y, packed_result, 0, 0));
}

TEST(PackedWeightBudget, ZeroBudgetPacksNothing) {
  MappedWeights m("packed_budget_zero");
  BudgetScope scope(0);
  const int64_t packed_before = packed_weight_bytes();
  for (int i = 0; i < kWeights; ++i)
    EXPECT_TRUE(all_close(linear(m.x, m.weights[i]).to(float32), m.expected[i], 0, 0)) << "weight " << i;
  EXPECT_EQ(packed_weight_bytes(), packed_before);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Sequential offload on a CPU host (kiln::set_resident_weight_budget): weights read in place from the mapping
// beyond the budget leave the process, least recently used first; the products do not change.
TEST(ResidentWeightBudget, ResidentSetFollowsTheBudgetAcrossRepeatedPasses) {
  MappedWeights m("resident_budget");
  const std::optional<int64_t> saved_packed = packed_weight_budget();
  const WeightPrepacking saved_prepacking = weight_prepacking();
  set_packed_weight_budget(0);
  set_weight_prepacking(WeightPrepacking::Always);
  const int64_t budget = kWeightBytes + kWeightBytes / 2;  // one weight and a half
  set_resident_weight_budget(budget);
  for (const Tensor& w : m.weights) w.storage()->drop_resident_pages();
  const double before = process_status_bytes("RssFile");
  double peak_growth = 0;
  for (int pass = 0; pass < 3; ++pass) {
    for (int i = 0; i < kWeights; ++i) {
      EXPECT_TRUE(all_close(linear(m.x, m.weights[i]).to(float32), m.expected[i], 0, 0)) << "pass " << pass;
      peak_growth = std::max(peak_growth, process_status_bytes("RssFile") - before);
    }
  }
  set_resident_weight_budget(std::nullopt);
  set_packed_weight_budget(saved_packed);
  set_weight_prepacking(saved_prepacking);
  // Unbudgeted, the passes would leave all four weights (64 MiB) resident; the budget keeps at most the
  // budget plus the weight being read.
  EXPECT_LT(peak_growth, static_cast<double>(budget + kWeightBytes) + 4.0 * 1024 * 1024);
  EXPECT_GT(peak_growth, 0.9 * kWeightBytes);  // the measurement sees a weight being read
}

}  // namespace
}  // namespace kiln
