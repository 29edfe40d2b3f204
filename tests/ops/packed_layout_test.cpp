// One packed copy per weight whatever layout oneDNN would prefer: a weight already packed (by another op,
// another M, other post-ops) is read in the layout it was packed in. oneDNN's preferred layout depends on the
// ISA: on AMX hosts linear and linear_fused prefer different ones (issue #12), on AVX-512 hosts they agree,
// so these tests pack the weight in a layout the op would not choose itself, which reproduces the AMX case on
// any host.
#include <gtest/gtest.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "backends/cpu/matmul_path.h"
#include "backends/cpu/onednn_util.h"
#include "kiln/core/device_runtime.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using dnnl::memory;
using testing::all_close;
using testing::values;

constexpr int64_t kM = 40, kK = 96, kN = 80;
constexpr int64_t kWeightBytes = kK * kN * 2;  // the bf16 weight's size; a packed copy is at least this

// The weight's [K, N] view as oneDNN reads it, packed into `tag` outside any op.
void pack_as(const Tensor& w, memory::format_tag tag) {
  const memory::desc plain =
      cpu_kernels::onednn::plain_desc({kK, kN}, {w.stride(1), w.stride(0)}, w.dtype(), "test");
  cpu_kernels::onednn::packed_weight(w, plain, memory::desc({kK, kN}, memory::data_type::bf16, tag));
}

// Live bytes on the CPU once every queued op has run.
int64_t live_bytes() {
  synchronize();
  return counters().memory_of(cpu).current_bytes;
}

// The blocked layout `op` packs a fresh weight in on this host (undef when it is none of oneDNN's bf16
// matmul weight layouts).
template <class Op>
memory::format_tag layout_chosen_by(Op op) {
  const Tensor w = values({kN, kK}, 9, -0.3, 0.3, bfloat16);
  {
    const Tensor y = op(w);
    synchronize();
  }
  const auto layout = cpu_kernels::onednn::packed_layout(w);
  EXPECT_TRUE(layout.has_value()) << "the op did not pack its weight";
  for (auto tag : {memory::format_tag::BA16a64b2a, memory::format_tag::BA16a48b2a,
                   memory::format_tag::BA16a32b2a, memory::format_tag::BA16a16b2a})
    if (layout && *layout == memory::desc({kK, kN}, memory::data_type::bf16, tag)) return tag;
  return memory::format_tag::undef;
}

// Packs a weight in a layout other than the one `op` prefers, then runs `op`: it must read that copy (no
// second packed copy, the layout unchanged) and give the product of the unpacked weight.
template <class Op>
void expect_reads_the_existing_packed_copy(Op op) {
  const memory::format_tag preferred = layout_chosen_by(op);
  const memory::format_tag other = preferred == memory::format_tag::BA16a32b2a
                                       ? memory::format_tag::BA16a16b2a
                                       : memory::format_tag::BA16a32b2a;
  const Tensor w = values({kN, kK}, 5, -0.3, 0.3, bfloat16);
  set_weight_prepacking(WeightPrepacking::Never);
  const Tensor expected = op(w).to(float32);
  synchronize();
  set_weight_prepacking(WeightPrepacking::Always);

  pack_as(w, other);
  const auto packed = cpu_kernels::onednn::packed_layout(w);
  ASSERT_TRUE(packed.has_value());
  const int64_t base = live_bytes();
  Tensor got;
  {
    const Tensor y = op(w);
    got = y.to(float32);
    synchronize();
  }
  EXPECT_LT(live_bytes() - base - static_cast<int64_t>(got.nbytes()), kWeightBytes)
      << "the op packed a second copy of a weight that was already packed";
  EXPECT_TRUE(*cpu_kernels::onednn::packed_layout(w) == *packed);
  EXPECT_TRUE(all_close(got, expected, 1e-2, 1e-2)) << "the op misread the packed weight";
}

class PackedLayout : public ::testing::Test {
 protected:
  void SetUp() override {
    before_ = weight_prepacking();
    set_weight_prepacking(WeightPrepacking::Always);
  }
  void TearDown() override { set_weight_prepacking(before_); }

 private:
  WeightPrepacking before_ = WeightPrepacking::Auto;
};

TEST_F(PackedLayout, LinearReadsAWeightPackedInAnotherLayout) {
  // Packing is the oneDNN path's: on a host whose bf16 products run on f32 FMA (matmul_path.h) it is unused.
  const cpu_kernels::ScopedBf16Path onednn_path(cpu_kernels::Bf16Path::Onednn);
  const Tensor x = values({2, kM / 2, kK}, 1, -1, 1, bfloat16);
  expect_reads_the_existing_packed_copy([&](const Tensor& w) { return linear(x, w); });
}

TEST_F(PackedLayout, LinearFusedReadsAWeightPackedInAnotherLayout) {
  // Packing is the oneDNN path's: on a host whose bf16 products run on f32 FMA (matmul_path.h) it is unused.
  const cpu_kernels::ScopedBf16Path onednn_path(cpu_kernels::Bf16Path::Onednn);
  const Tensor x = values({2, kM / 2, kK}, 1, -1, 1, bfloat16);
  const LinearEpilogue e{Activation::GeluTanh, values({2, 1, kN}, 2, -1, 1, bfloat16),
                         values({2, kM / 2, kN}, 3, -1, 1, bfloat16)};
  expect_reads_the_existing_packed_copy([&](const Tensor& w) { return linear_fused(x, w, {}, e); });
}

TEST_F(PackedLayout, EveryRowCountReadsTheFirstConsumersCopy) {
  // Packing is the oneDNN path's: on a host whose bf16 products run on f32 FMA (matmul_path.h) it is unused.
  const cpu_kernels::ScopedBf16Path onednn_path(cpu_kernels::Bf16Path::Onednn);
  // A weight first used with one row (a pooled vector) and then with many: one packed copy.
  const Tensor w = values({kN, kK}, 5, -0.3, 0.3, bfloat16);
  {
    const Tensor y = linear(values({1, kK}, 1, -1, 1, bfloat16), w);
    synchronize();
  }
  const auto first = cpu_kernels::onednn::packed_layout(w);
  ASSERT_TRUE(first.has_value());
  const int64_t base = live_bytes();
  {
    const Tensor y = linear(values({4096, kK}, 2, -1, 1, bfloat16), w);
    synchronize();
  }
  EXPECT_LT(live_bytes() - base, kWeightBytes);
  EXPECT_TRUE(*cpu_kernels::onednn::packed_layout(w) == *first);
}

}  // namespace
}  // namespace kiln
