#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/signal_registry.h"
#include "kiln/core/error.h"

namespace kiln::io {

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILN_CHECK(fd >= 0, path << ": cannot open: " << std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    KILN_FAIL(path << ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return std::shared_ptr<MappedFile>(new MappedFile(nullptr, 0, -1, -1));
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    KILN_FAIL(path << ": cannot map " << size << " bytes: " << std::strerror(err));
  }
  const int slot = detail::register_mapped_file(p, size, fd, path);
  return std::shared_ptr<MappedFile>(new MappedFile(static_cast<const char*>(p), size, fd, slot));
}

MappedFile::~MappedFile() {
  detail::unregister_mapped_file(slot_);
  if (size_ > 0) ::munmap(const_cast<char*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kiln::io
