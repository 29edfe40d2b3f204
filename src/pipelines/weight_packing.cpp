#include "kiln/pipelines/weight_packing.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "kiln/core/bytes.h"
#include "kiln/core/error.h"
#include "kiln/core/log.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/execution_context.h"

namespace kiln {

namespace {

// The first number in a cgroup limit file ("max" or absent: no limit).
std::optional<int64_t> cgroup_limit(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return std::nullopt;
  try {
    const long long v = std::stoll(s);
    return v > 0 ? std::optional<int64_t>(v) : std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

int64_t machine_memory_bytes() {
  int64_t bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"})
    if (const auto limit = cgroup_limit(path); limit && *limit < bytes) bytes = *limit;
  return bytes;
}

WeightPackingPlan plan_weight_packing(int64_t weight_bytes, std::optional<int64_t> requested,
                                      int64_t memory_bytes) {
  WeightPackingPlan plan;
  plan.weight_bytes = weight_bytes;
  plan.memory_bytes = memory_bytes;
  plan.requested = requested.has_value();
  if (requested)
    plan.budget = *requested == kAllWeightsPacked ? std::nullopt
                                                  : std::optional<int64_t>(std::max<int64_t>(*requested, 0));
  else
    plan.budget = weight_bytes <= memory_bytes / 2 ? std::nullopt : std::optional<int64_t>(0);
  return plan;
}

WeightPackingPlan apply_weight_packing(int64_t weight_bytes, std::optional<int64_t> requested) {
  WeightPackingPlan plan = plan_weight_packing(weight_bytes, requested);
  set_packed_weight_budget(plan.budget);
  if (log_enabled("memory")) log("memory", plan.describe());
  return plan;
}

std::string WeightPackingPlan::describe() const {
  std::ostringstream s;
  s << "weights " << format_bytes(weight_bytes) << "; packed copies for the matmuls: ";
  if (!budget) {
    s << "all (resident once: each weight's file pages are handed back once it is packed)";
  } else if (*budget == 0) {
    s << "none, the weights stay in the memory-mapped files (page cache)";
  } else {
    s << "up to " << format_bytes(*budget)
      << ", the other weights stay in the memory-mapped files (page cache)";
  }
  if (requested)
    s << " [as requested]";
  else if (budget)
    s << " [the weights exceed half of this machine's " << format_bytes(memory_bytes) << "]";
  else
    s << " [they fit in half of this machine's " << format_bytes(memory_bytes) << "]";
  return s.str();
}

int64_t parse_byte_budget(const std::string& text, const std::string& flag) {
  if (text == "all") return kAllWeightsPacked;
  if (text == "none") return 0;
  static const std::pair<const char*, double> kUnits[] = {{"TiB", 1024.0 * 1024 * 1024 * 1024},
                                                          {"GiB", 1024.0 * 1024 * 1024},
                                                          {"MiB", 1024.0 * 1024},
                                                          {"KiB", 1024.0},
                                                          {"TB", 1e12},
                                                          {"GB", 1e9},
                                                          {"MB", 1e6},
                                                          {"KB", 1e3},
                                                          {"B", 1.0}};
  double scale = 1.0;
  std::string number = text;
  for (const auto& [suffix, factor] : kUnits) {
    const std::string sfx(suffix);
    if (number.size() > sfx.size() && number.compare(number.size() - sfx.size(), sfx.size(), sfx) == 0) {
      number.resize(number.size() - sfx.size());
      scale = factor;
      break;
    }
  }
  double value = 0;
  size_t used = 0;
  try {
    value = std::stod(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const double bytes = value * scale;
  KILN_CHECK(used == number.size() && used > 0 && std::isfinite(bytes) && bytes >= 0 && bytes < 9.2e18,
             flag << ": expected a size such as 12GiB, 512MiB, 8GB or a byte count, or all / none; got '"
                  << text << "'");
  return static_cast<int64_t>(bytes);
}

}  // namespace kiln
