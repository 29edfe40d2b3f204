// all_reduce_sum and all_gather across the ranks, in every execution mode.
#include <gtest/gtest.h>

#include "kiln/core/device_runtime.h"
#include "kiln/dist/process_group.h"
#include "kiln/ops/collective.h"
#include "kiln/ops/elementwise.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/execution_context.h"

namespace kiln {
namespace {

// [2, 3] holding rank * 10 + i.
Tensor rank_values(DType dtype) {
  std::vector<float> v;
  for (int i = 0; i < 6; ++i) v.push_back(static_cast<float>(dist::rank() * 10 + i));
  return Tensor::from_vector(v, {2, 3}).to(dtype);
}

TEST(Collective, RunsUnderTwoRanks) {
  ASSERT_EQ(dist::world_size(), 2) << "run this test under mpirun -np 2";
}

TEST(Collective, AllReduceSumsInEveryMode) {
  for (EagerMode mode :
       {EagerMode::DeferNever, EagerMode::DeferAndFuse, EagerMode::DeferNeverLaunchBlocking}) {
    EagerModeGuard guard(mode);
    for (DType dtype : {float32, bfloat16, float16}) {
      // Twice on the same input: the graph passes must not merge the two as one duplicate.
      const Tensor x = rank_values(dtype);
      const Tensor a = all_reduce_sum(x);
      const Tensor b = all_reduce_sum(x);
      const std::vector<float> got = add(a, b).to(float32).to_vector<float>();
      for (int i = 0; i < 6; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], 2.0f * (10 + 2 * i)) << i;
    }
  }
}

TEST(Collective, DeferredGraphNeverMergesTwoCollectives) {
  // Two all-reduces of one tensor look like duplicates to the graph passes but for their sequence numbers;
  // merging them would change how many collectives each rank issues.
  EagerModeGuard guard(EagerMode::DeferAndFuse);
  const Tensor x = rank_values(float32);
  synchronize();
  const Counters before = counters();
  const Tensor a = all_reduce_sum(x), b = all_reduce_sum(x);
  const Tensor sum = add(a, b);
  synchronize();
  EXPECT_EQ(sum.to_vector<float>()[0], 20.0f);
  const Counters after = counters();
  EXPECT_EQ(after.ops_eliminated - before.ops_eliminated, 0);
  EXPECT_EQ(after.kernels_launched - before.kernels_launched, 3);  // two collectives and the add
}

TEST(Collective, AllGatherConcatenatesInRankOrder) {
  for (EagerMode mode : {EagerMode::DeferNever, EagerMode::DeferAndFuse}) {
    EagerModeGuard guard(mode);
    const Tensor last = all_gather(rank_values(float32), -1);
    ASSERT_EQ(last.shape(), (Shape{2, 6}));
    EXPECT_EQ(last.to_vector<float>(), (std::vector<float>{0, 1, 2, 10, 11, 12, 3, 4, 5, 13, 14, 15}));
    const Tensor first = all_gather(rank_values(float32), 0);
    ASSERT_EQ(first.shape(), (Shape{4, 3}));
    EXPECT_EQ(first.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15}));
  }
}

TEST(Collective, RejectsIntegerTensors) {
  EXPECT_THROW(all_reduce_sum(Tensor::from_vector(std::vector<int64_t>{1, 2}, {2})), Error);
}

}  // namespace
}  // namespace kiln
