#include "kiln/core/bytes.h"

#include <cmath>
#include <cstdio>

namespace kiln {

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : u >= 3 ? "%.2f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace kiln
