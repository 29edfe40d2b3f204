// The system C++ compiler as the CPU JIT uses it: found at run time (CXX, else c++ or g++ in PATH), asked
// for its version (part of the kernel cache key), and run to build a shared object from one source file.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kiln::graph {

class JitCompiler {
 public:
  // `command` is the compiler command line prefix ("g++", "/usr/bin/clang++", "ccache g++"); empty means
  // CXX from the environment, else c++, else g++. Nothing runs until available() or compile().
  explicit JitCompiler(std::string command = {});

  // True when the compiler ran and reported a version (checked once).
  bool available();
  // The first line of `<compiler> --version`; empty when unavailable.
  const std::string& version();
  // What was tried, for the fallback warning ("CXX=/nonexistent", "c++, g++").
  const std::string& description() const { return description_; }

  // Builds `source_path` into `so_path` with the fused-kernel flags plus `isa_flags`. Returns the compiler's
  // output (for the warning) when it fails, nullopt on success.
  std::optional<std::string> compile(const std::string& source_path, const std::string& so_path,
                                     const std::string& isa_flags);

  // The fixed flags: part of the cache key.
  static const char* base_flags();

 private:
  void detect();

  std::vector<std::vector<std::string>> candidates_;
  std::vector<std::string> argv0_;  // the chosen compiler command, split on spaces
  std::string version_;
  std::string description_;
  bool detected_ = false;
};

}  // namespace kiln::graph
