// Reader for GGUF files (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), versions 2 and 3:
// "GGUF", a version, tensor and metadata counts, metadata key/values, tensor infos (name, dims in ggml
// order, type, offset), then the tensor data at `general.alignment` (default 32) boundaries.
// The file is memory-mapped and validated strictly before anything is trusted: every read is bounds-checked,
// every tensor must lie inside the data section, aligned, without overlap, with a size that matches its
// shape and type. Errors are kiln::Error naming the file, the tensor or key, and what was expected.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/quant/quantized_tensor.h"
#include "kiln/quant/storage_type.h"

namespace kiln::io {

struct GgufTensorInfo {
  std::string name;
  quant::StorageType type;
  Shape shape;          // torch order (outermost first): ggml's ne[] reversed, as the gguf package reports it
  uint64_t offset = 0;  // from the start of the data section
  uint64_t bytes = 0;
};

// A metadata value: integers (any width, bools as 0/1), floats, strings, and arrays of those.
// Arrays of arrays are validated and skipped (std::monostate); GGUF diffusion files do not use them.
using GgufValue = std::variant<std::monostate, int64_t, uint64_t, double, bool, std::string,
                               std::vector<int64_t>, std::vector<double>, std::vector<std::string>>;

class MappedFile;

class GgufFile {
 public:
  // Maps and validates `path`; throws kiln::Error naming the file and the problem.
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Tensor names in file order.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const GgufTensorInfo& info(const std::string& name) const;
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  // A string metadata value, or nullopt when absent or not a string.
  std::optional<std::string> metadata_string(const std::string& key) const;

  // The tensor as floats: F32/F16/BF16 as a zero-copy view in that dtype; quantized types dequantized into
  // a new float32 tensor (the gguf package's values, bit for bit).
  Tensor tensor(const std::string& name) const;
  // The tensor's stored blocks as uint8 [rows, row_bytes] (a zero-copy view of the file) with its type and
  // logical shape; rows = numel / shape.back().
  quant::QuantizedTensor blocks(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_start_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, GgufTensorInfo> infos_;
  std::map<std::string, GgufValue> metadata_;
};

}  // namespace kiln::io
