// Helpers shared by the tests: where committed reference data lives, and tensor comparison with messages
// that say where and by how much two tensors differ.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/io/safetensors.h"

namespace kiln::testing {

// Absolute path of a file under tests/data ($KILN_TEST_DATA_DIR when set, else the source tree's).
std::string data_path(const std::string& relative);
// A fresh empty directory for the calling test (removed and re-created on each call, removed when the
// process exits).
std::string temp_dir(const std::string& name);

// This test binary run again in a child process, as `env` (a shell prefix: assignments, `env -u NAME`, ...)
// followed by the binary with --gtest_filter='filter': its wait status (0 when every selected test passed)
// and everything it printed, stdout and stderr together. For what a process decides once (a kernel variant,
// a matmul path) and for failures that must not take the parent down.
struct ChildRun {
  int status = -1;
  std::string output;
};
ChildRun run_this_binary(const std::string& env, const std::string& filter);

// Deterministic pseudo-random values in [lo, hi) (a small LCG: no dependence on a library's stream).
Tensor values(const Shape& shape, uint32_t seed, double lo = -1.0, double hi = 1.0, DType dtype = float32);

// A field of /proc/self/status in bytes ("RssAnon": anonymous resident memory, "VmRSS", "VmHWM"); 0 when
// absent.
double process_status_bytes(const std::string& field);

// Passes when |actual - expected| <= atol + rtol * |expected| everywhere (NaNs must match); shapes must
// match.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol, double atol);
// Passes when max|a - e| / max(max|e|, tiny) <= tolerance: the "relative max error" used by the issues.
::testing::AssertionResult rel_max_error_within(const Tensor& actual, const Tensor& expected,
                                                double tolerance);

// 8-bit image comparison against a uint8 reference tensor (same number of values; a size mismatch fails the
// calling test): the share of values within one level, and the mean absolute difference in levels.
double share_within_one_level(const std::vector<uint8_t>& pixels, const Tensor& reference_u8);
double mean_level_difference(const std::vector<uint8_t>& pixels, const Tensor& reference_u8);

}  // namespace kiln::testing
