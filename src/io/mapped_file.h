// A read-only memory mapping of a whole file, unmapped when the last reference goes away. The file stays
// open while mapped and the mapping is registered (core/signal_registry.h), so that check_mapped_files() can
// tell when it changes on disk and a SIGBUS on its pages is reported with its path.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace kiln::io {

class MappedFile {
 public:
  // Throws kiln::Error naming the path when the file cannot be opened or mapped.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile(const char* data, size_t size, int fd, int slot)
      : data_(data), size_(size), fd_(fd), slot_(slot) {}
  const char* data_;
  size_t size_;
  int fd_;
  int slot_;
};

}  // namespace kiln::io
