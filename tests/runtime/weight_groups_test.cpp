// Group offloading's mechanism (kiln/runtime/weight_groups.h) on weights read in place from a mapped
// checkpoint: the process's measured file-backed resident set holds the running group and the one being
// brought in, not the model; the group expected next is mapped before its kernels read it; products do not
// change (issue #13).
#include "kiln/runtime/weight_groups.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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
constexpr double kWeightBytes = 2.0 * kOut * kIn;
constexpr double kAllowance = 4.0 * 1024 * 1024;  // pages at the tensors' edges, the reader's own pages
constexpr int kBlocks = 6;

// kBlocks mapped weights, one per group, read in place (no packed copies), and their products.
class WeightGroupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_packed_ = packed_weight_budget();
    set_packed_weight_budget(0);
    std::vector<std::pair<std::string, Tensor>> named;
    for (int i = 0; i < kBlocks; ++i)
      named.emplace_back("blocks." + std::to_string(i) + ".weight",
                         values({kOut, kIn}, 20 + i, -0.1, 0.1, bfloat16));
    const std::string path = temp_dir("weight_groups") + "/weights.safetensors";
    io::save_safetensors(path, named);
    file_ = std::make_unique<io::SafetensorsFile>(path);
    for (int i = 0; i < kBlocks; ++i) {
      weights_.push_back(file_->tensor("blocks." + std::to_string(i) + ".weight"));
      expected_.push_back(linear(x_, weights_.back()).to(float32));
    }
    synchronize();
  }
  void TearDown() override {
    clear_weight_groups();
    set_packed_weight_budget(saved_packed_);
  }

  void register_groups(bool prefetch) {
    std::vector<WeightGroup> groups;
    for (int i = 0; i < kBlocks; ++i)
      groups.push_back({"model", "blocks." + std::to_string(i), {weights_[i]}});
    set_weight_groups(std::move(groups), prefetch);
    for (const Tensor& w : weights_) w.storage()->drop_resident_pages();
  }

  // Runs every block `passes` times in order, checking each product; returns the largest growth of the
  // file-backed resident set seen after a block ran.
  double run_passes(int passes) {
    const double before = process_status_bytes("RssFile");
    double peak_growth = 0;
    for (int pass = 0; pass < passes; ++pass)
      for (int i = 0; i < kBlocks; ++i) {
        EXPECT_TRUE(all_close(linear(x_, weights_[i]).to(float32), expected_[i], 0, 0)) << "block " << i;
        peak_growth = std::max(peak_growth, process_status_bytes("RssFile") - before);
      }
    return peak_growth;
  }

  Tensor x_ = values({8, kIn}, 3, -1, 1, bfloat16);
  std::unique_ptr<io::SafetensorsFile> file_;
  std::vector<Tensor> weights_, expected_;
  std::optional<int64_t> saved_packed_;
};

TEST_F(WeightGroupsTest, ResidentSetHoldsTheRunningGroupAndTheNextOne) {
  register_groups(/*prefetch=*/true);
  const double growth = run_passes(3);
  const WeightGroupStats stats = weight_group_stats();
  clear_weight_groups();
  // Without groups, the passes leave all six weights (96 MiB) mapped.
  EXPECT_LT(growth, 2 * kWeightBytes + kAllowance);
  EXPECT_GT(growth, 0.9 * kWeightBytes) << "the measurement sees a weight being read";
  EXPECT_EQ(stats.groups, kBlocks);
  EXPECT_EQ(stats.switches, 3 * kBlocks);
  EXPECT_EQ(stats.released, 3 * kBlocks - 1) << "every group but the last sent out when the next ran";
  // Each switch after the first goes to the group that was prefetched (the next one, wrapping around).
  EXPECT_EQ(stats.prefetch_hits, 3 * kBlocks - 1);
  EXPECT_GT(stats.prefetched_bytes, 0);
}

TEST_F(WeightGroupsTest, WithoutGroupsEveryWeightStaysMapped) {
  for (const Tensor& w : weights_) w.storage()->drop_resident_pages();
  const double growth = run_passes(1);
  EXPECT_GT(growth, (kBlocks - 0.5) * kWeightBytes) << "the resident-set measurement would miss offloading";
}

TEST_F(WeightGroupsTest, TheNextGroupIsMappedBeforeItsKernelsRun) {
  register_groups(/*prefetch=*/true);
  const double before = process_status_bytes("RssFile");
  EXPECT_TRUE(all_close(linear(x_, weights_[0]).to(float32), expected_[0], 0, 0));
  // The prefetch thread maps block 1 while nothing reads it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (weight_group_stats().prefetched_bytes < 0.9 * kWeightBytes &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_GE(weight_group_stats().prefetched_bytes, 0.9 * kWeightBytes);
  EXPECT_GT(process_status_bytes("RssFile") - before, 1.8 * kWeightBytes)
      << "block 0 read and block 1 mapped";
}

TEST_F(WeightGroupsTest, WithoutPrefetchOnlyTheRunningGroupStays) {
  register_groups(/*prefetch=*/false);
  const double growth = run_passes(2);
  const WeightGroupStats stats = weight_group_stats();
  EXPECT_LT(growth, kWeightBytes + kAllowance);
  EXPECT_EQ(stats.prefetches, 0);
  EXPECT_EQ(stats.switches, 2 * kBlocks);
}

// A pipeline releasing a component stops the prefetch first: once stop_weight_prefetch returns, nothing maps
// the released pages back.
TEST_F(WeightGroupsTest, NothingIsMappedAfterPrefetchStops) {
  register_groups(/*prefetch=*/true);
  EXPECT_TRUE(all_close(linear(x_, weights_[0]).to(float32), expected_[0], 0, 0));
  synchronize();
  stop_weight_prefetch();  // block 1's prefetch, in flight or done
  const int64_t prefetched = weight_group_stats().prefetched_bytes;
  for (const Tensor& w : weights_) w.storage()->drop_resident_pages();
  const double after_release = process_status_bytes("RssFile");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(process_status_bytes("RssFile") - after_release, kAllowance);
  EXPECT_EQ(weight_group_stats().prefetched_bytes, prefetched);
}

}  // namespace
}  // namespace kiln
