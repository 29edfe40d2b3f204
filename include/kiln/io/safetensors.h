// Reader for the safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length, a JSON header mapping names to {dtype, shape, data_offsets}, then the raw bytes.
// The file is memory-mapped; tensors are read lazily and, where the layout allows, returned as zero-copy
// views that keep the mapping alive. The header is validated strictly before anything is trusted.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::io {

struct TensorInfo {
  std::string name;
  std::string stored_dtype;  // as written in the file: "BF16", "F8_E4M3", "F4", ...
  // The Kiln dtype it is read as. Stored types Kiln lacks widen losslessly: F8_* and F4 to bfloat16,
  // U16 to int32, U32 to int64, U64 to int64 (values above INT64_MAX are rejected when read).
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
};

class MappedFile;

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws kiln::Error naming the file and the problem.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  // Tensor names in file order (by data offset).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Size of the file in bytes (header included).
  uint64_t file_size() const;

  // The whole tensor: a view into the mapping when its stored dtype is native and aligned, otherwise a copy.
  // BOOL tensors are checked to hold only 0 and 1.
  Tensor tensor(const std::string& name) const;
  // Rows [start, end) along dimension 0, reading only those bytes.
  Tensor rows(const std::string& name, int64_t start, int64_t end) const;
  // Columns [start, end) along the last dimension (a strided view; contiguous() copies only those bytes).
  Tensor columns(const std::string& name, int64_t start, int64_t end) const;
  // The stored bytes of a tensor of whole-byte elements (not F4) as they lie in the file, without widening:
  // a zero-copy uint8 view [rows, row bytes], one row per index of the dimensions before the last (a scalar
  // is one row). How an fp8 weight stays fp8 (nn::CheckpointWeights::load_quantized).
  Tensor stored_bytes(const std::string& name) const;

 private:
  const char* tensor_bytes(const TensorInfo& info) const;

  std::string path_;
  std::shared_ptr<MappedFile> file_;
  uint64_t data_start_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (any Kiln dtype) to `path` atomically: a temporary file renamed into place.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace kiln::io
