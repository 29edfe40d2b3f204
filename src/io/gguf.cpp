#include "kiln/io/gguf.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "io/mapped_file.h"
#include "io/shape_bound.h"

namespace kiln::io {

namespace {

constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS

enum class ValueType : uint32_t {
  UInt8 = 0,
  Int8 = 1,
  UInt16 = 2,
  Int16 = 3,
  UInt32 = 4,
  Int32 = 5,
  Float32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  UInt64 = 10,
  Int64 = 11,
  Float64 = 12,
};

// Bytes of a fixed-size value type; 0 for strings and arrays.
uint64_t fixed_size(ValueType t) {
  switch (t) {
    case ValueType::UInt8:
    case ValueType::Int8:
    case ValueType::Bool:
      return 1;
    case ValueType::UInt16:
    case ValueType::Int16:
      return 2;
    case ValueType::UInt32:
    case ValueType::Int32:
    case ValueType::Float32:
      return 4;
    case ValueType::UInt64:
    case ValueType::Int64:
    case ValueType::Float64:
      return 8;
    default:
      return 0;
  }
}

// A bounds-checked little-endian cursor over the mapped header. Every failure names the file, what was
// being read and where.
class Reader {
 public:
  Reader(const std::string& path, const char* data, uint64_t size) : path_(path), data_(data), size_(size) {}

  uint64_t position() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t bytes, const std::string& what) const {
    KILN_CHECK(bytes <= remaining(), path_ << ": truncated: " << what << " needs " << bytes
                                           << " bytes at offset " << pos_ << " but the file ends at "
                                           << size_);
  }
  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what) {
    const auto len = read<uint64_t>(what + " (string length)");
    need(len, what + " (a string of " + std::to_string(len) + " bytes)");
    std::string s(data_ + pos_, static_cast<size_t>(len));
    pos_ += len;
    return s;
  }
  void skip(uint64_t bytes, const std::string& what) {
    need(bytes, what);
    pos_ += bytes;
  }

 private:
  const std::string& path_;
  const char* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

ValueType read_value_type(Reader& r, const std::string& path, const std::string& what) {
  const auto t = r.read<uint32_t>(what + " type");
  KILN_CHECK(t <= static_cast<uint32_t>(ValueType::Float64),
             path << ": " << what << " has unknown value type " << t << " (expected 0..12)");
  return static_cast<ValueType>(t);
}

// A fixed-size scalar as int64 / uint64 / double / bool.
GgufValue read_scalar(Reader& r, ValueType t, const std::string& what) {
  switch (t) {
    case ValueType::UInt8:
      return static_cast<uint64_t>(r.read<uint8_t>(what));
    case ValueType::Int8:
      return static_cast<int64_t>(r.read<int8_t>(what));
    case ValueType::UInt16:
      return static_cast<uint64_t>(r.read<uint16_t>(what));
    case ValueType::Int16:
      return static_cast<int64_t>(r.read<int16_t>(what));
    case ValueType::UInt32:
      return static_cast<uint64_t>(r.read<uint32_t>(what));
    case ValueType::Int32:
      return static_cast<int64_t>(r.read<int32_t>(what));
    case ValueType::UInt64:
      return r.read<uint64_t>(what);
    case ValueType::Int64:
      return r.read<int64_t>(what);
    case ValueType::Float32:
      return static_cast<double>(r.read<float>(what));
    case ValueType::Float64:
      return r.read<double>(what);
    case ValueType::Bool:
      return r.read<uint8_t>(what) != 0;
    default:
      break;
  }
  KILN_FAIL("internal: not a scalar GGUF type");
}

GgufValue read_value(Reader& r, ValueType t, const std::string& path, const std::string& what, int depth);

GgufValue read_array(Reader& r, const std::string& path, const std::string& what, int depth) {
  KILN_CHECK(depth < 8, path << ": " << what << ": arrays nested more than 8 deep (corrupt file?)");
  const ValueType elem = read_value_type(r, path, what + " element");
  const auto count = r.read<uint64_t>(what + " (array length)");
  // Every element takes at least one byte (strings eight), so a count larger than the rest of the file is
  // corrupt; checking it first keeps a huge count from reserving memory.
  const uint64_t min_elem = elem == ValueType::String || elem == ValueType::Array ? 8 : fixed_size(elem);
  KILN_CHECK(count <= r.remaining() / min_elem,
             path << ": truncated: " << what << " claims " << count << " elements of at least " << min_elem
                  << " bytes but only " << r.remaining() << " bytes remain");
  if (elem == ValueType::String) {
    std::vector<std::string> out;
    out.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) out.push_back(r.read_string(what + "[" + std::to_string(i) + "]"));
    return out;
  }
  if (elem == ValueType::Array) {
    for (uint64_t i = 0; i < count; ++i) read_array(r, path, what + "[" + std::to_string(i) + "]", depth + 1);
    return std::monostate{};
  }
  if (elem == ValueType::Float32 || elem == ValueType::Float64) {
    std::vector<double> out;
    out.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) out.push_back(std::get<double>(read_scalar(r, elem, what)));
    return out;
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    const GgufValue v = read_scalar(r, elem, what);
    if (const auto* u = std::get_if<uint64_t>(&v))
      out.push_back(static_cast<int64_t>(*u));
    else if (const auto* s = std::get_if<int64_t>(&v))
      out.push_back(*s);
    else
      out.push_back(std::get<bool>(v) ? 1 : 0);
  }
  return out;
}

GgufValue read_value(Reader& r, ValueType t, const std::string& path, const std::string& what, int depth) {
  if (t == ValueType::String) return r.read_string(what);
  if (t == ValueType::Array) return read_array(r, path, what, depth);
  return read_scalar(r, t, what);
}

}  // namespace

GgufFile::GgufFile(const std::string& path) : path_(path), file_(MappedFile::open(path)) {
  const uint64_t size = file_->size();
  Reader r(path, file_->data(), size);
  r.need(4, "the 'GGUF' magic");
  KILN_CHECK(std::memcmp(file_->data(), "GGUF", 4) == 0,
             path << ": not a GGUF file (expected the magic 'GGUF' in the first 4 bytes)");
  r.skip(4, "the magic");
  version_ = r.read<uint32_t>("the version");
  KILN_CHECK(version_ != 1, path << ": GGUF version 1 is not supported (expected version 2 or 3)");
  KILN_CHECK((version_ & 0xffff) != 0 || version_ == 0,
             path << ": GGUF version field " << version_
                  << " looks byte-swapped: big-endian GGUF files are not supported");
  KILN_CHECK(version_ == 2 || version_ == 3,
             path << ": unsupported GGUF version " << version_ << " (expected 2 or 3)");
  const auto tensor_count = r.read<uint64_t>("the tensor count");
  const auto kv_count = r.read<uint64_t>("the metadata count");
  // A key/value takes at least 12 bytes and a tensor info at least 24: larger counts cannot fit.
  KILN_CHECK(kv_count <= r.remaining() / 12, path << ": truncated or corrupt: " << kv_count
                                                  << " metadata entries cannot fit in the " << r.remaining()
                                                  << " bytes that remain");
  KILN_CHECK(tensor_count <= r.remaining() / 24, path << ": truncated or corrupt: " << tensor_count
                                                      << " tensor infos cannot fit in the " << r.remaining()
                                                      << " bytes that remain");

  for (uint64_t i = 0; i < kv_count; ++i) {
    const std::string key = r.read_string("metadata key #" + std::to_string(i));
    const std::string what = "metadata '" + key + "'";
    const ValueType t = read_value_type(r, path, what);
    GgufValue value = read_value(r, t, path, what, 0);
    if (key == "general.alignment") {
      KILN_CHECK(t == ValueType::UInt32, path << ": general.alignment must be a uint32");
      const uint64_t a = std::get<uint64_t>(value);
      KILN_CHECK(a != 0 && (a & (a - 1)) == 0,
                 path << ": general.alignment " << a << " is not a power of two");
      alignment_ = a;
    }
    KILN_CHECK(metadata_.emplace(key, std::move(value)).second,
               path << ": metadata key '" << key << "' appears twice");
  }

  std::vector<GgufTensorInfo> infos;
  infos.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo info;
    info.name = r.read_string("the name of tensor #" + std::to_string(i));
    const std::string where = path + ": tensor '" + info.name + "'";
    const auto n_dims = r.read<uint32_t>("the dimension count of tensor '" + info.name + "'");
    KILN_CHECK(n_dims >= 1 && n_dims <= kMaxDims,
               where << ": " << n_dims << " dimensions (expected 1 to " << kMaxDims << ")");
    std::vector<uint64_t> ne(n_dims);
    ShapeBound bound;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ne[d] = r.read<uint64_t>("the dimensions of tensor '" + info.name + "'");
      KILN_CHECK(bound.add(ne[d]), where << ": dimensions overflow the element count (corrupt file?)");
    }
    const uint64_t numel = bound.numel();
    const auto type_id = r.read<uint32_t>("the type of tensor '" + info.name + "'");
    const auto traits = quant::find_ggml_type(type_id);
    KILN_CHECK(traits.has_value(), where << ": unsupported ggml type id " << type_id << " (Kiln reads "
                                         << quant::supported_type_names() << ")");
    info.type = traits->type;
    info.offset = r.read<uint64_t>("the data offset of tensor '" + info.name + "'");
    KILN_CHECK(ne[0] % traits->block_size == 0, where << ": a row of " << ne[0]
                                                      << " elements is not a whole number of " << traits->name
                                                      << " blocks of " << traits->block_size);
    // ne[0] is the innermost (contiguous) dimension; torch's shape lists the outermost first.
    for (uint32_t d = n_dims; d-- > 0;) info.shape.push_back(static_cast<int64_t>(ne[d]));
    // A row's bytes too: with another dimension 0 the tensor is empty, but its rows are still sized
    // (blocks()) and 2^61 F32 elements are 2^63 bytes.
    uint64_t row_bytes = 0;
    KILN_CHECK(!__builtin_mul_overflow(ne[0] / traits->block_size, static_cast<uint64_t>(traits->type_size),
                                       &row_bytes) &&
                   row_bytes <= ShapeBound::kMaxElements,
               where << ": a row of " << ne[0] << " " << traits->name << " elements overflows its byte size "
                     << "(corrupt file?)");
    const uint64_t blocks = numel / static_cast<uint64_t>(traits->block_size);
    KILN_CHECK(!__builtin_mul_overflow(blocks, static_cast<uint64_t>(traits->type_size), &info.bytes),
               where << ": byte size overflows (corrupt file?)");
    KILN_CHECK(info.offset % alignment_ == 0, where << ": data offset " << info.offset
                                                    << " is not a multiple of the alignment " << alignment_);
    infos.push_back(std::move(info));
  }

  // The data section starts at the next alignment boundary after the tensor infos.
  const uint64_t header_end = r.position();
  data_start_ = (header_end + alignment_ - 1) / alignment_ * alignment_;
  KILN_CHECK(infos.empty() || data_start_ <= size, path << ": truncated: the data section would start at "
                                                        << data_start_ << " but the file has " << size
                                                        << " bytes");
  const uint64_t data_size = data_start_ <= size ? size - data_start_ : 0;
  for (auto& info : infos) {
    const std::string where = path + ": tensor '" + info.name + "'";
    KILN_CHECK(info.offset <= data_size && info.bytes <= data_size - info.offset,
               where << ": " << quant::type_name(info.type) << " " << shape_str(info.shape) << " needs "
                     << info.bytes << " bytes at data offset " << info.offset
                     << ", past the end of the data section (" << data_size << " bytes; file truncated?)");
    KILN_CHECK(!infos_.count(info.name), path << ": tensor '" << info.name << "' appears twice");
    names_.push_back(info.name);
    infos_.emplace(info.name, info);
  }
  std::vector<const GgufTensorInfo*> by_offset;
  for (const auto& [name, info] : infos_) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& prev = *by_offset[i - 1];
    const GgufTensorInfo& cur = *by_offset[i];
    KILN_CHECK(cur.offset >= prev.offset + prev.bytes,
               path << ": tensor '" << cur.name << "' (data offset " << cur.offset << ") overlaps tensor '"
                    << prev.name << "' (bytes " << prev.offset << " to " << prev.offset + prev.bytes << ")");
  }
}

const GgufTensorInfo& GgufFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  KILN_CHECK(it != infos_.end(),
             path_ << ": no tensor named '" << name << "' (the file has " << infos_.size() << " tensors)");
  return it->second;
}

std::optional<std::string> GgufFile::metadata_string(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  if (const auto* s = std::get_if<std::string>(&it->second)) return *s;
  return std::nullopt;
}

quant::QuantizedTensor GgufFile::blocks(const std::string& name) const {
  const GgufTensorInfo& i = info(name);
  const int64_t k = i.shape.back();
  const int64_t rows = k == 0 ? 0 : shape_numel(i.shape) / k;
  const int64_t row_bytes = quant::row_bytes(i.type, k);
  const char* src = file_->data() + data_start_ + i.offset;
  auto storage = Storage::borrow_file_pages(src, static_cast<size_t>(i.bytes), cpu, file_);
  const Shape shape{rows, row_bytes};
  return {Tensor(storage, shape, contiguous_strides(shape), 0, uint8), i.type, i.shape};
}

Tensor GgufFile::tensor(const std::string& name) const {
  const GgufTensorInfo& i = info(name);
  if (!quant::traits(i.type).is_quantized) {
    const DType dtype = quant::plain_dtype(i.type);
    const char* src = file_->data() + data_start_ + i.offset;
    // The data section and every offset are aligned (to 8 bytes at least in practice); an odd
    // general.alignment could break that, so unaligned data is copied instead of viewed.
    if (reinterpret_cast<uintptr_t>(src) % dtype_size(dtype) == 0) {
      auto storage = Storage::borrow_file_pages(src, static_cast<size_t>(i.bytes), cpu, file_);
      return Tensor(storage, i.shape, contiguous_strides(i.shape), 0, dtype);
    }
    return Tensor::from_blob(src, i.shape, dtype);
  }
  return blocks(name).dequantize();
}

}  // namespace kiln::io
