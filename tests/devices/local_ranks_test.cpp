// In-process ranks (kiln/dist/local_ranks.h): threads, one per xla-cpu device, whose collectives run inside
// one executable compiled for a replica per rank's device (StableHLO all_reduce / all_gather). Nothing here
// initialises MPI, so a collective that fell back to the host path would throw ("the process group is not
// initialised"): a right answer is the in-device path's.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/pjrt/executable_cache.h"
#include "backends/pjrt/stablehlo/collective_module.h"
#include "kiln/core/tensor.h"
#include "kiln/dist/local_ranks.h"
#include "kiln/dist/process_group.h"
#include "kiln/ops.h"
#include "runtime/op_call.h"
#include "support/pjrt_devices.h"

namespace kiln {
namespace {

using testing::test_device;  // xla-cpu:N unless KILN_TEST_DEVICE names another type

// Rank r's values: (r + 1) * [1, 2, ..., n] + 0.25 * r (exact in bfloat16 for the sizes used).
std::vector<float> rank_values(int r, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = float(r + 1) * float(i + 1) + 0.25f * float(r);
  return v;
}

class LocalRanks : public ::testing::TestWithParam<int> {};

TEST_P(LocalRanks, AllReduceSumsEveryRankOnItsDevice) {
  KILN_SKIP_WITHOUT_TEST_DEVICES(GetParam());
  const int n = GetParam();
  for (DType dtype : {float32, bfloat16}) {
    std::vector<std::vector<float>> got(static_cast<size_t>(n));
    dist::run_local_ranks(n, [&](int rank) {
      EXPECT_EQ(dist::rank(), rank);
      EXPECT_EQ(dist::world_size(), n);
      EXPECT_TRUE(dist::in_local_ranks());
      const Tensor x = Tensor::from_vector(rank_values(rank, 6), {2, 3}).to(dtype).to(test_device(rank));
      const Tensor sum = all_reduce_sum(x);
      EXPECT_EQ(sum.device(), test_device(rank));
      EXPECT_EQ(sum.dtype(), dtype);
      got[static_cast<size_t>(rank)] = sum.to(float32).to_vector<float>();
    });
    std::vector<float> expected(6, 0.0f);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < 6; ++i) expected[i] += rank_values(r, 6)[i];
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(got[static_cast<size_t>(r)], expected) << dtype_name(dtype) << " rank " << r;
  }
  EXPECT_FALSE(dist::in_local_ranks());
  EXPECT_EQ(dist::world_size(), 1);  // the calling thread is no rank
}

TEST_P(LocalRanks, AllGatherConcatenatesInRankOrderAlongAnyDim) {
  KILN_SKIP_WITHOUT_TEST_DEVICES(GetParam());
  const int n = GetParam();
  for (int64_t dim : {0, 1}) {
    std::vector<Tensor> got(static_cast<size_t>(n));
    dist::run_local_ranks(n, [&](int rank) {
      // A transposed view as input: the front end makes it contiguous, the module reads its storage.
      const Tensor x =
          Tensor::from_vector(rank_values(rank, 6), {3, 2}).to(test_device(rank)).transpose(0, 1);
      got[static_cast<size_t>(rank)] = all_gather(x, dim).to(cpu);
    });
    std::vector<Tensor> parts;
    for (int r = 0; r < n; ++r)
      parts.push_back(Tensor::from_vector(rank_values(r, 6), {3, 2}).transpose(0, 1));
    const Tensor expected = concat(parts, dim);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(got[static_cast<size_t>(r)].shape(), expected.shape());
      EXPECT_EQ(got[static_cast<size_t>(r)].to_vector<float>(), expected.to_vector<float>()) << "dim " << dim;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TwoAndFourDevices, LocalRanks, ::testing::Values(2, 4));

TEST(LocalRanksOnDevices, OneExecutablePerCollectiveShapeAcrossTheDevices) {
  KILN_SKIP_WITHOUT_TEST_DEVICES(4);
  // Ten all-reduces of one shape compile once (the placement is part of the cache key, the executable runs
  // on both devices).
  dist::run_local_ranks(2, [&](int rank) {
    const Tensor x = Tensor::from_vector(rank_values(rank, 5), {5}).to(test_device(rank + 2));
    all_reduce_sum(x).to(cpu);  // the first one compiles (or loads from disk)
  });
  const auto before = pjrt::executable_cache_stats();
  dist::run_local_ranks(2, [&](int rank) {
    for (int i = 0; i < 10; ++i) {
      const Tensor x = Tensor::from_vector(rank_values(rank + i, 5), {5}).to(test_device(rank + 2));
      std::vector<float> expected = rank_values(i, 5);
      for (size_t k = 0; k < 5; ++k) expected[k] += rank_values(i + 1, 5)[k];
      EXPECT_EQ(all_reduce_sum(x).to_vector<float>(), expected);
    }
  });
  const auto after = pjrt::executable_cache_stats();
  EXPECT_EQ(after.compiles, before.compiles);
  EXPECT_EQ(after.disk_hits, before.disk_hits);
}

TEST(LocalRanksOnDevices, TheModuleReducesInFloat32AcrossTheReplicas) {
  // Golden structure of what a bfloat16 all-reduce between two ranks emits.
  const Tensor x = Tensor::empty({4}, bfloat16, cpu);
  runtime::OpCall call{"all_reduce_sum", {x}, {Tensor::empty({4}, bfloat16, cpu)}, {}, false};
  const std::string text = pjrt::hlo::collective_module(call, 2);
  EXPECT_NE(text.find("\"stablehlo.all_reduce\""), std::string::npos) << text;
  EXPECT_NE(text.find("replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>"), std::string::npos) << text;
  EXPECT_NE(text.find("(tensor<4xbf16>) -> tensor<4xf32>"), std::string::npos) << text;  // summed in f32
  EXPECT_NE(text.find("(tensor<4xf32>) -> tensor<4xbf16>"), std::string::npos) << text;  // rounded once
  runtime::OpCall gather{"all_gather", {x}, {Tensor::empty({16}, bfloat16, cpu)}, {}, false};
  gather.attrs.set("dim", int64_t(0));
  const std::string gathered = pjrt::hlo::collective_module(gather, 4);
  EXPECT_NE(
      gathered.find("all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>"),
      std::string::npos)
      << gathered;
  runtime::OpCall other{"add", {x, x}, {x}, {}, true};
  EXPECT_NE(
      testing::error_message([&] { pjrt::hlo::collective_module(other, 2); }).find("add is not a collective"),
      std::string::npos);
}

TEST(LocalRanksOnDevices, CpuRanksExchangeThroughHostMemory) {
  std::vector<std::vector<float>> got(3);
  dist::run_local_ranks(3, [&](int rank) {
    const Tensor x = Tensor::from_vector(rank_values(rank, 4), {4});
    got[static_cast<size_t>(rank)] = all_reduce_sum(x).to_vector<float>();
    const Tensor g = all_gather(Tensor::from_vector(std::vector<float>{float(rank)}, {1}), 0);
    EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{0, 1, 2}));
  });
  std::vector<float> expected(4, 0.0f);
  for (int r = 0; r < 3; ++r)
    for (size_t i = 0; i < 4; ++i) expected[i] += rank_values(r, 4)[i];
  for (const auto& g : got) EXPECT_EQ(g, expected);
}

TEST(LocalRanksOnDevices, AFailingRankEndsTheOthersInsteadOfHangingThem) {
  KILN_SKIP_WITHOUT_TEST_DEVICES(1);
  std::atomic<int> peers_failed{0};
  const auto start = std::chrono::steady_clock::now();
  const std::string message = testing::error_message([&] {
    dist::run_local_ranks(2, [&](int rank) {
      if (rank == 1) throw Error("rank one could not read its shard");
      try {
        all_reduce_sum(Tensor::from_vector(std::vector<float>{1.0f}, {1}).to(test_device(0)))
            .to_vector<float>();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1 failed: rank one could not read its shard"),
                  std::string::npos)
            << e.what();
        ++peers_failed;
        throw;
      }
    });
  });
  EXPECT_EQ(message, "rank one could not read its shard");  // the first failure, not its consequence
  EXPECT_EQ(peers_failed.load(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(LocalRanksOnDevices, RanksOnOneDeviceOrDisagreeingCallsAreRefused) {
  KILN_SKIP_WITHOUT_TEST_DEVICES(2);
  const std::string same = testing::error_message([&] {
    dist::run_local_ranks(2, [&](int) {
      all_reduce_sum(Tensor::from_vector(std::vector<float>{1.0f}, {1}).to(test_device(1)))
          .to_vector<float>();
    });
  });
  EXPECT_NE(same.find("ranks 0 and 1 are both on " + test_device(1).str() +
                      "; in-process ranks need a device each"),
            std::string::npos)
      << same;
  const std::string disagree = testing::error_message([&] {
    dist::run_local_ranks(2, [&](int rank) {
      all_reduce_sum(Tensor::zeros({rank + 1}, float32).to(test_device(rank))).to_vector<float>();
    });
  });
  EXPECT_NE(disagree.find("every rank must make the same collectives in order"), std::string::npos)
      << disagree;
}

TEST(LocalRanksOnDevices, BadGroupsAreRefused) {
  EXPECT_NE(
      testing::error_message([] { dist::run_local_ranks(0, [](int) {}); }).find("0 ranks; give at least 1"),
      std::string::npos);
  const std::string nested = testing::error_message(
      [] { dist::run_local_ranks(1, [](int) { dist::run_local_ranks(2, [](int) {}); }); });
  EXPECT_NE(nested.find("called from a rank of another in-process group"), std::string::npos) << nested;
}

TEST(LocalRanksOnDevices, BroadcastGivesEveryRankRankZerosBytes) {
  std::vector<uint64_t> got(4);
  dist::run_local_ranks(4, [&](int rank) {
    uint64_t seed = 1000 + uint64_t(rank);
    dist::broadcast_from_rank0(&seed, sizeof seed);
    got[size_t(rank)] = seed;
  });
  EXPECT_EQ(got, (std::vector<uint64_t>(4, 1000)));
}

// A rank hands its calls to a thread of its own (kiln serve's job worker): there, as_this_rank makes that
// thread the rank, for its collectives on the device too; outside the call the thread is no rank again.
TEST(LocalRanksOnDevices, AThreadActsAsTheRankThatHandsItWork) {
  KILN_SKIP_WITHOUT_TEST_DEVICES(2);
  std::vector<uint64_t> got(2);
  std::vector<float> reduced;
  std::atomic<bool> worker_outside_is_no_rank{false};
  dist::run_local_ranks(2, [&](int rank) {
    uint64_t value = 7 + uint64_t(rank);
    const Tensor x = Tensor::from_vector(rank_values(rank, 4), {4}).to(test_device(rank));
    if (rank == 1) {
      dist::broadcast_from_rank0(&value, sizeof value);
      got[1] = value;
      all_reduce_sum(x).to(cpu);
      return;
    }
    const auto as_rank0 = dist::as_this_rank();
    std::thread worker([&] {
      as_rank0([&] {
        EXPECT_EQ(dist::rank(), 0);
        EXPECT_EQ(dist::world_size(), 2);
        dist::broadcast_from_rank0(&value, sizeof value);
        got[0] = value;
        reduced = all_reduce_sum(x).to_vector<float>();
      });
      worker_outside_is_no_rank = !dist::in_local_ranks();
    });
    worker.join();
  });
  EXPECT_EQ(got, (std::vector<uint64_t>{7, 7}));
  std::vector<float> expected = rank_values(0, 4);
  for (size_t k = 0; k < 4; ++k) expected[k] += rank_values(1, 4)[k];
  EXPECT_EQ(reduced, expected);
  EXPECT_TRUE(worker_outside_is_no_rank);
  // Off the rank threads it runs the work as it is.
  bool ran = false;
  dist::as_this_rank()([&] { ran = !dist::in_local_ranks(); });
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace kiln
