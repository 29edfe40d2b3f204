#include "backends/pjrt/plugin_locator.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "core/cache_dir.h"
#include "kiln/core/error.h"

namespace kiln::pjrt {
namespace {

namespace fs = std::filesystem;

struct Kind {
  std::string_view name;
  std::vector<std::string_view> package_files;  // inside a Python package folder
  std::string_view install;                     // how a user gets it
};

const std::vector<Kind>& kinds() {
  static const std::vector<Kind> k = {
      {"xla-cpu",
       {"lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"},
       "./scripts/setup.sh --pjrt (or: python3 -m pip install lammps-jax-pjrt-cpu==0.11.2)"},
      {"cuda",
       {"jax_plugins/xla_cuda13/xla_cuda_plugin.so", "jax_plugins/xla_cuda12/xla_cuda_plugin.so"},
       "python3 -m pip install jax-cuda13-pjrt (or jax-cuda12-pjrt; the nvidia-* CUDA wheels it pulls in "
       "must be "
       "on the library path)"},
      {"tpu", {"libtpu/libtpu.so"}, "python3 -m pip install libtpu (on a TPU VM)"},
  };
  return k;
}

const Kind& kind_of(std::string_view name) {
  for (const Kind& k : kinds())
    if (k.name == name) return k;
  KILN_FAIL("PJRT: unknown device kind '" << name << "': expected xla-cpu, cuda or tpu");
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// <prefix>/lib/python3*/<leaf> for every python3.x folder there, newest version name first.
void python_folders(const fs::path& lib, std::string_view leaf, std::vector<fs::path>& out) {
  std::error_code ec;
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(lib, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("python3")) found.push_back(entry.path() / leaf);
  }
  std::sort(found.rbegin(), found.rend());
  out.insert(out.end(), found.begin(), found.end());
}

std::vector<fs::path> package_folders() {
  std::vector<fs::path> dirs;
  if (const std::string venv = env("VIRTUAL_ENV"); !venv.empty())
    python_folders(fs::path(venv) / "lib", "site-packages", dirs);
  std::istringstream pythonpath(env("PYTHONPATH"));
  for (std::string entry; std::getline(pythonpath, entry, ':');)
    if (!entry.empty()) dirs.emplace_back(entry);
  // The Python found on PATH, whose environment need not be activated: images often put a virtual
  // environment's bin/ first on PATH without setting VIRTUAL_ENV (the GPU machines' /opt/torch/.venv does).
  std::istringstream path(env("PATH"));
  for (std::string entry; std::getline(path, entry, ':');) {
    std::error_code ec;
    if (!entry.empty() && fs::is_regular_file(fs::path(entry) / "python3", ec))
      python_folders(fs::path(entry).parent_path() / "lib", "site-packages", dirs);
  }
  if (const std::string home = env("HOME"); !home.empty())
    python_folders(fs::path(home) / ".local" / "lib", "site-packages", dirs);
  python_folders("/usr/local/lib", "dist-packages", dirs);
  dirs.emplace_back("/usr/lib/python3/dist-packages");
  return dirs;
}

}  // namespace

std::vector<std::string> plugin_candidates(std::string_view device_kind) {
  const Kind& kind = kind_of(device_kind);
  std::vector<std::string> paths;
  if (const std::string dir = env("KILN_PJRT_PLUGIN_DIR"); !dir.empty()) {
    for (std::string_view file : kind.package_files) {
      const std::string path = (fs::path(dir) / fs::path(file).filename()).string();
      if (std::find(paths.begin(), paths.end(), path) == paths.end()) paths.push_back(path);
    }
  }
  if (kind.name == "xla-cpu") {
    if (const std::string cache = cache_dir(); !cache.empty())
      paths.push_back((fs::path(cache) / "pjrt" / "lib" / "pjrt_c_api_cpu_plugin.so").string());
  }
  for (const fs::path& folder : package_folders())
    for (std::string_view file : kind.package_files) paths.push_back((folder / file).string());
  return paths;
}

std::string first_existing_file(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) return path;
  }
  return "";
}

std::string find_plugin(std::string_view device_kind) {
  const Kind& kind = kind_of(device_kind);
  if (const std::string path = env("KILN_PJRT_PLUGIN"); !path.empty()) {
    std::error_code ec;
    KILN_CHECK(fs::is_regular_file(path, ec), "PJRT: KILN_PJRT_PLUGIN=" << path
                                                                        << " is not a file (it should name "
                                                                        << "a PJRT plugin's .so)");
    return path;
  }
  const std::vector<std::string> candidates = plugin_candidates(device_kind);
  if (std::string found = first_existing_file(candidates); !found.empty()) return found;
  std::ostringstream message;
  message << "PJRT: no " << kind.name << " plugin found. Install it: " << kind.install
          << "; or set KILN_PJRT_PLUGIN to a plugin's path. Looked in:";
  for (const std::string& path : candidates) message << "\n  " << path;
  KILN_FAIL(message.str());
}

}  // namespace kiln::pjrt
