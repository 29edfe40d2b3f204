#include "cli/weight_traffic.h"

#include <fstream>

#include "kiln/core/bytes.h"

namespace kiln::cli {

int64_t disk_bytes_read() {
  std::ifstream io("/proc/self/io");
  for (std::string line; std::getline(io, line);)
    if (line.rfind("read_bytes:", 0) == 0) return std::stoll(line.substr(11));
  return 0;
}

WeightTraffic::WeightTraffic() : disk_(disk_bytes_read()) {}

std::string WeightTraffic::since_last(const MemoryPolicy& memory) {
  const int64_t disk = disk_bytes_read(), streamed = memory.weight_group_stats().prefetched_bytes;
  // Group registration restarts the streamed count; a smaller value is a new count, not a negative amount.
  const int64_t d = disk - disk_, s = streamed >= streamed_ ? streamed - streamed_ : streamed;
  disk_ = disk;
  streamed_ = streamed;
  std::string out;
  if (d >= 50'000'000) out += "read " + format_bytes(d) + " from disk";
  if (s >= 50'000'000) out += (out.empty() ? "" : ", ") + format_bytes(s) + " streamed in groups";
  return out;
}

}  // namespace kiln::cli
