// Weights read from a checkpoint are memory-mapped file pages. Once linear has packed a weight for oneDNN,
// every later call reads the packed copy, so the file pages are handed back to the OS: the weights are
// resident once, not twice (issue #7: "weights prepacked once ... without doubling memory").
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/cpu/matmul_path.h"
#include "kiln/core/device_runtime.h"
#include "kiln/io/safetensors.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::all_close;
using testing::temp_dir;

constexpr int64_t kOut = 2048, kIn = 4096;  // a 16 MiB bfloat16 weight
constexpr double kWeightBytes = 2.0 * kOut * kIn;

// The process's resident set, from /proc/self/statm.
double resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  EXPECT_NE(f, nullptr);
  if (f != nullptr) {
    EXPECT_EQ(std::fscanf(f, "%ld %ld", &pages, &resident), 2);
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// Reads one byte of every page, so that all of a mapped tensor is resident.
void touch(const Tensor& t) {
  const auto* p = static_cast<const volatile unsigned char*>(t.raw_data());
  unsigned sum = 0;
  for (size_t i = 0; i < t.storage()->bytes(); i += 4096) sum += p[i];
  (void)sum;
}

Tensor pattern(int64_t rows, int64_t cols, int salt) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(static_cast<int>((i * 7 + salt) % 251) - 125) / 256;
  return Tensor::from_vector(v, {rows, cols}).to(bfloat16);
}

class PrepackAlways {
 public:
  PrepackAlways() : saved_(weight_prepacking()) { set_weight_prepacking(WeightPrepacking::Always); }
  ~PrepackAlways() { set_weight_prepacking(saved_); }

 private:
  WeightPrepacking saved_;
};

TEST(PackedWeightMemory, FilePagesCanBeDroppedAndReadBack) {
  const Tensor w = pattern(kOut, kIn, 1);
  const std::string path = temp_dir("packed_weight_pages") + "/w.safetensors";
  io::save_safetensors(path, {{"w", w}});
  io::SafetensorsFile file(path);
  const Tensor mapped = file.tensor("w");
  ASSERT_TRUE(mapped.storage()->is_file_pages());
  touch(mapped);
  const double before = resident_bytes();
  mapped.storage()->drop_resident_pages();
  EXPECT_GT(before - resident_bytes(), 0.9 * kWeightBytes);
  EXPECT_TRUE(all_close(mapped, w, 0, 0));  // read back from the file, unchanged

  // Owned memory is never dropped: the call is a no-op there.
  const Tensor owned = w.clone();
  owned.storage()->drop_resident_pages();
  EXPECT_FALSE(owned.storage()->is_file_pages());
  EXPECT_TRUE(all_close(owned, w, 0, 0));
}

TEST(PackedWeightMemory, PackingAMappedWeightDoesNotDoubleIt) {
  PrepackAlways packing;
  const Tensor x = pattern(8, kIn, 3);
  const Tensor w = pattern(kOut, kIn, 2);
  // Warm-up on another weight of the same shape: oneDNN's primitives and scratchpads exist before measuring.
  (void)linear(x, pattern(kOut, kIn, 5)).to_vector<float>();

  const std::string path = temp_dir("packed_weight_linear") + "/w.safetensors";
  io::save_safetensors(path, {{"w", w}});
  io::SafetensorsFile file(path);
  const Tensor mapped = file.tensor("w");
  touch(mapped);
  const double before = resident_bytes();
  const Tensor y = linear(x, mapped);
  synchronize();
  // The packed copy (+16 MiB) replaces the file pages (-16 MiB); keeping both would add the whole weight.
  EXPECT_LT(resident_bytes() - before, 0.5 * kWeightBytes);
  EXPECT_TRUE(all_close(y, linear(x, w), 0, 0));
  EXPECT_TRUE(all_close(linear(x, mapped), y, 0, 0));  // later calls: the same packed copy
  EXPECT_TRUE(all_close(mapped, w, 0, 0));             // the weight itself still reads right
}

// Offloading on a CPU host (Module::release_weights): the packed copy is freed and the file pages are handed
// back, and the next forward reads the weight from the file again, unchanged.
TEST(PackedWeightMemory, ReleasingAModuleFreesItsPackedCopiesAndFilePages) {
  // Packing is the oneDNN path's: on a host whose bf16 products run on f32 FMA (matmul_path.h) it is unused.
  const cpu_kernels::ScopedBf16Path onednn_path(cpu_kernels::Bf16Path::Onednn);
  PrepackAlways packing;
  const Tensor x = pattern(8, kIn, 3);
  const Tensor w = pattern(kOut, kIn, 2);
  const std::string path = temp_dir("packed_weight_release") + "/w.safetensors";
  io::save_safetensors(path, {{"weight", w}});
  nn::Linear layer(kIn, kOut, /*bias=*/false);
  layer.load_weights(nn::CheckpointWeights(path), {.dtype = bfloat16});
  ASSERT_TRUE(layer.weight.storage()->is_file_pages());

  const int64_t packed_before = packed_weight_bytes();
  const Tensor y = layer(x);
  synchronize();
  EXPECT_GE(packed_weight_bytes() - packed_before, kWeightBytes);
  EXPECT_GE(layer.release_weights(), static_cast<size_t>(kWeightBytes));
  EXPECT_EQ(packed_weight_bytes(), packed_before) << "the packed copy outlived the release";
  EXPECT_TRUE(all_close(layer(x), y, 0, 0));  // packed again from the file

  // Unpacked, the weight's file pages are what it holds: released, they leave the process.
  set_weight_prepacking(WeightPrepacking::Never);
  layer.release_weights();
  touch(layer.weight);
  const double before = resident_bytes();
  layer.release_weights();
  EXPECT_GT(before - resident_bytes(), 0.9 * kWeightBytes);
  EXPECT_TRUE(all_close(layer(x), y, 0, 0));
}

}  // namespace
}  // namespace kiln
