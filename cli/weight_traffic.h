// What the weights cost in reads while a pipeline runs, for the progress bar: bytes this process read from
// the disk (page-cache misses, mapped checkpoints included) and bytes group offloading brought in ahead of
// use.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/runtime/memory_policy.h"

namespace kiln::cli {

class WeightTraffic {
 public:
  WeightTraffic();
  // Since the last call (or construction): "read 2.89 GiB from disk, 8.75 GiB streamed in groups" (by the
  // weight groups of `memory`, a pipeline's context's policy), the parts that are zero left out; empty when
  // both are.
  std::string since_last(const MemoryPolicy& memory);

 private:
  int64_t disk_ = 0, streamed_ = 0;
};

// The bytes this process has caused to be read from storage (/proc/self/io read_bytes); 0 where unknown.
int64_t disk_bytes_read();

}  // namespace kiln::cli
