#include "fuzz_support.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace kiln::fuzz {

MemoryFile::MemoryFile(const char* name) {
  fd_ = ::memfd_create(name, MFD_CLOEXEC);
  if (fd_ < 0) {
    std::perror("memfd_create");
    std::abort();
  }
  path_ = "/proc/self/fd/" + std::to_string(fd_);
}

MemoryFile::~MemoryFile() {
  if (fd_ >= 0) ::close(fd_);
}

void MemoryFile::assign(std::string_view bytes) {
  if (::ftruncate(fd_, 0) != 0) std::abort();
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
}

namespace {

struct ScratchDir {
  std::string path;
  ScratchDir() {
    namespace fs = std::filesystem;
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    // The pid in the name lets fuzz/campaign.sh remove the folders of dead processes only.
    std::string pattern = (base / ("kiln-fuzz-" + std::to_string(::getpid()) + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    path = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

const std::string& scratch_dir() {
  static ScratchDir dir;
  return dir.path;
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::abort();
}

std::vector<std::string_view> split(std::string_view data, std::string_view separator, size_t parts) {
  std::vector<std::string_view> out;
  while (out.size() + 1 < parts) {
    const size_t at = data.find(separator);
    if (at == std::string_view::npos) break;
    out.push_back(data.substr(0, at));
    data.remove_prefix(at + separator.size());
  }
  out.push_back(data);
  return out;
}

std::string source_path(const std::string& relative) {
  return std::string(KILN_SOURCE_DIR) + "/" + relative;
}

uint64_t touch(const void* data, size_t size) {
  const auto* p = static_cast<const volatile unsigned char*>(data);
  uint64_t sum = 0;
  for (size_t i = 0; i < size; ++i) sum += p[i];
  return sum;
}

void make_runtime_deterministic() {
  ::setenv("KILN_LAUNCH_BLOCKING", "1", 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
}

}  // namespace kiln::fuzz
