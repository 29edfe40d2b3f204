// A read-only memory mapping of a whole file, unmapped when the last reference goes away.
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
  MappedFile(const char* data, size_t size) : data_(data), size_(size) {}
  const char* data_;
  size_t size_;
};

}  // namespace kiln::io
