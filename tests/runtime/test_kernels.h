// Kernels the runtime tests register under "runtime_test.*" names: they block, record, fail or sleep so
// that the tests can observe when and in what order the stream runs them.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::runtime_test {

// Registers the kernels once (idempotent).
void register_test_kernels();

// "runtime_test.block": waits until release is set (or 20 s pass), then sets finished.
extern std::atomic<bool> block_release;
extern std::atomic<bool> block_finished;
// "runtime_test.append" (attr "value"): appends value to appended; only the worker writes it.
extern std::vector<int64_t> appended;
// "runtime_test.sleep_write" (attr "ms", "value"): sleeps, then writes value into its float32 output.
// "runtime_test.fail": throws a kiln::Error "deliberate failure".
// "runtime_test.fail_std": throws std::runtime_error "plain failure".
// "runtime_test.omp": records the team size of an OpenMP parallel region into omp_team.
extern std::atomic<int> omp_team;
// "runtime_test.nested": dispatches a copy into its output from inside the kernel and reads it back
// (item()) there, storing the value read in nested_read.
extern std::atomic<double> nested_read;
// "runtime_test.exit" (attr "value"): calls std::exit(value) from the kernel.
// "runtime_test.lazy_static" (attrs "ms", "value"): creates a function-local static on its first run, sets
// lazy_static_created, then for `ms` milliseconds checks that the static is alive; if it is destroyed under
// the kernel, the process ends at once with std::_Exit(value).
extern std::atomic<bool> lazy_static_created;

// Dispatches one of the kernels above with the given inputs/outputs.
void run(const char* op, std::vector<Tensor> inputs, std::vector<Tensor> outputs, int64_t value = 0,
         int64_t ms = 0);

}  // namespace kiln::runtime_test
