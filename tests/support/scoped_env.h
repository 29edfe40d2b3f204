// Test helpers that change the process for one scope: environment variables set or unset, and a fresh
// temporary folder.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace kiln::testing {

// Sets (or, with nullopt, unsets) environment variables for one scope, restoring each after.
class ScopedEnv {
 public:
  void set(const char* name, const std::optional<std::string>& value) {
    if (!saved_.count(name)) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    value ? setenv(name, value->c_str(), 1) : unsetenv(name);
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_)
      value ? setenv(name.c_str(), value->c_str(), 1) : unsetenv(name.c_str());
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// An empty folder <tmp>/<prefix>-<name>-<pid>, emptied first if it exists; the caller removes it.
inline std::filesystem::path temp_folder(const std::string& prefix, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (prefix + "-" + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace kiln::testing
