#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/signal_registry.h"
#include "kiln/core/error.h"
#include "kiln/core/signals.h"

namespace kiln::io {

namespace {

std::string parent_dir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// A name nobody else will pick: pid, a per-process counter and a random number. O_EXCL guards the rest.
std::string temp_name_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  const std::filesystem::path p(path);
  return (p.parent_path() / ("." + p.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                             std::to_string(counter++) + "-" + std::to_string(salt % 1000000)))
      .string();
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  KILN_CHECK(!path_.empty(), "cannot write a file with an empty path");
  std::error_code ec;
  KILN_CHECK(!std::filesystem::is_directory(path_, ec), path_ << ": cannot write: it is a directory");
  const auto status = std::filesystem::symlink_status(path_, ec);
  KILN_CHECK(!std::filesystem::exists(status) || std::filesystem::is_regular_file(status) ||
                 std::filesystem::is_symlink(status),
             path_ << ": cannot write: it exists and is not a regular file (a device, pipe or socket), which "
                      "the write would replace");
  const std::string dir = parent_dir(path_);
  KILN_CHECK(std::filesystem::is_directory(dir, ec),
             path_ << ": cannot write: directory " << dir << " does not exist");
  for (int attempt = 0; attempt < 8 && fd_ < 0; ++attempt) {
    temp_path_ = temp_name_for(path_);
    // 0666 so the final file gets the usual permissions after the umask, like any newly created file.
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  KILN_CHECK(fd_ >= 0, path_ << ": cannot create a file in " << dir << ": " << std::strerror(errno));
  signal_slot_ = detail::register_temp_file(temp_path_);
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
}

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
  detail::unregister_temp_file(signal_slot_);
  signal_slot_ = -1;
}

void AtomicFile::write(const void* data, size_t size) {
  KILN_CHECK(fd_ >= 0 && !committed_, path_ << ": write after commit");
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    KILN_CHECK(n > 0, path_ << ": write failed: " << (n < 0 ? std::strerror(errno) : "no progress"));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  KILN_CHECK(fd_ >= 0 && !committed_, path_ << ": commit twice");
  throw_if_stop_requested("before " + path_ + " was complete");
  KILN_CHECK(::fsync(fd_) == 0, path_ << ": fsync failed: " << std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  KILN_CHECK(::close(fd) == 0, path_ << ": close failed: " << std::strerror(errno));
  KILN_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0,
             path_ << ": cannot rename " << temp_path_ << " into place: " << std::strerror(errno));
  committed_ = true;
  detail::unregister_temp_file(signal_slot_);
  signal_slot_ = -1;
  // Best effort: some filesystems refuse fsync on directories; the data itself is already on disk.
  const int dir_fd = ::open(parent_dir(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace kiln::io
