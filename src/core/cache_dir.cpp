#include "core/cache_dir.h"

#include <cstdlib>
#include <filesystem>

namespace kiln {

std::string cache_dir() {
  namespace fs = std::filesystem;
  if (const char* d = std::getenv("KILN_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "kiln").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "kiln").string();
  return "";
}

}  // namespace kiln
