// What the fuzz targets share. Each target is one LLVMFuzzerTestOneInput; built with libFuzzer under clang
// (KILN_FUZZ=ON, build-fuzz/) it searches the input space, and built by any compiler with replay_main.cpp it
// runs the committed corpus once (the fuzz.replay_* tests).
//
// The property every target checks: bad input is answered by a kiln::Error with a message. Any other
// exception escapes LLVMFuzzerTestOneInput and aborts, which libFuzzer reports as a crash, as it does
// sanitizer reports, signals, timeouts and leaks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.h"

namespace kiln::fuzz {

// The fuzzer's bytes as a file that the loaders open by path, without touching the disk: a memfd, reused
// from one input to the next; its path is /proc/self/fd/N.
class MemoryFile {
 public:
  explicit MemoryFile(const char* name);
  ~MemoryFile();
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  // Replaces the contents.
  void assign(std::string_view bytes);
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A folder of this process's own under /dev/shm (else the temporary directory), kiln-fuzz-<pid>-XXXXXX,
// removed at exit.
const std::string& scratch_dir();

// Writes `bytes` to `path` (created or truncated).
void write_file(const std::string& path, std::string_view bytes);

// `data` cut at each `separator` into at most `parts` pieces; the last piece keeps any further separators.
std::vector<std::string_view> split(std::string_view data, std::string_view separator, size_t parts);

// A committed file of the source tree (fixtures the targets load once).
std::string source_path(const std::string& relative);

// Runs `f`. A kiln::Error is the expected answer to bad input, but it must say something.
template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    if (std::string_view(e.what()).empty()) std::abort();
  }
}

// Aborts (a finding) when an invariant of a successful parse does not hold.
inline void require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
    std::abort();
  }
}

// Reads every byte of a buffer into a value the optimiser cannot drop, so that a view reaching past its
// mapping is touched (and faults) here rather than never.
uint64_t touch(const void* data, size_t size);

// For targets whose code runs tensor ops: one thread, every op synchronous, so that a finding reproduces.
void make_runtime_deterministic();

}  // namespace kiln::fuzz
