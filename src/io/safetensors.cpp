#include "kiln/io/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/json_depth.h"
#include "io/mapped_file.h"
#include "io/shape_bound.h"
#include "kiln/core/device_runtime.h"
#include "kiln/quant/storage_type.h"
#include "kiln/runtime/execution_context.h"

namespace kiln::io {

namespace {

// Headers of real checkpoints are a few hundred KB; anything this large is corrupt (the spec's own limit).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// How a stored element becomes a Kiln element: natively (same bytes), or widened losslessly.
enum class Widen { None, F8E4M3, F8E5M2, F8E4M3Fnuz, F8E5M2Fnuz, F8E8M0, F4E2M1, U16, U32, U64 };

struct StoredDType {
  const char* name;
  uint32_t bits;
  DType read_as;
  Widen widen;
};

constexpr StoredDType kStoredDTypes[] = {
    {"F64", 64, DType::Float64, Widen::None},
    {"F32", 32, DType::Float32, Widen::None},
    {"F16", 16, DType::Float16, Widen::None},
    {"BF16", 16, DType::BFloat16, Widen::None},
    {"I64", 64, DType::Int64, Widen::None},
    {"I32", 32, DType::Int32, Widen::None},
    {"I16", 16, DType::Int16, Widen::None},
    {"I8", 8, DType::Int8, Widen::None},
    {"U8", 8, DType::UInt8, Widen::None},
    {"BOOL", 8, DType::Bool, Widen::None},
    {"U16", 16, DType::Int32, Widen::U16},
    {"U32", 32, DType::Int64, Widen::U32},
    {"U64", 64, DType::Int64, Widen::U64},
    // Every value of these small float formats is exactly representable in bfloat16.
    {"F8_E4M3", 8, DType::BFloat16, Widen::F8E4M3},
    {"F8_E5M2", 8, DType::BFloat16, Widen::F8E5M2},
    {"F8_E4M3FNUZ", 8, DType::BFloat16, Widen::F8E4M3Fnuz},
    {"F8_E5M2FNUZ", 8, DType::BFloat16, Widen::F8E5M2Fnuz},
    {"F8_E8M0", 8, DType::BFloat16, Widen::F8E8M0},
    {"F4", 4, DType::BFloat16, Widen::F4E2M1},
};

constexpr const char* kKnownDTypes =
    "F64, F32, F16, BF16, I64, I32, I16, I8, U8, U16, U32, U64, BOOL, F8_E4M3, F8_E5M2, F8_E4M3FNUZ, "
    "F8_E5M2FNUZ, "
    "F8_E8M0 or F4";

const StoredDType* find_stored_dtype(const std::string& name) {
  for (const auto& d : kStoredDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

const char* stored_name(DType d) {
  switch (d) {
    case DType::Float64:
      return "F64";
    case DType::Float32:
      return "F32";
    case DType::Float16:
      return "F16";
    case DType::BFloat16:
      return "BF16";
    case DType::Int64:
      return "I64";
    case DType::Int32:
      return "I32";
    case DType::Int16:
      return "I16";
    case DType::Int8:
      return "I8";
    case DType::UInt8:
      return "U8";
    case DType::Bool:
      return "BOOL";
  }
  return "?";
}

// A float with `man_bits` of mantissa and exponent bias `bias`, no special values (callers handle those).
float minifloat(uint32_t sign, uint32_t exp, uint32_t man, int man_bits, int bias) {
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), 1 - bias - man_bits)
                             : std::ldexp(static_cast<float>((1u << man_bits) | man),
                                          static_cast<int>(exp) - bias - man_bits);
  return sign ? -mag : mag;
}

float decode_small_float(Widen kind, uint8_t b) {
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  switch (kind) {
    case Widen::F8E4M3Fnuz:  // "fnuz": no infinity, no negative zero; the negative-zero pattern is NaN
      return b == 0x80 ? nan : minifloat(b >> 7, (b >> 3) & 0xf, b & 0x7, 3, 8);
    case Widen::F8E5M2Fnuz:
      return b == 0x80 ? nan : minifloat(b >> 7, (b >> 2) & 0x1f, b & 0x3, 2, 16);
    case Widen::F8E8M0:  // an unsigned power of two (MX block scales)
      return b == 0xff ? nan : std::ldexp(1.0f, static_cast<int>(b) - 127);
    case Widen::F4E2M1:  // one nibble: S.EE.M, bias 1, no special values
      return minifloat((b >> 3) & 1, (b >> 1) & 0x3, b & 0x1, 1, 1);
    default:
      break;
  }
  KILN_FAIL("safetensors: internal: not a small float format");
}

// Converts elements [first, first + count) of a tensor stored at `src` into `dst` of the widened dtype.
void widen(const StoredDType& stored, const char* src, uint64_t first, int64_t count, void* dst,
           const std::string& where) {
  switch (stored.widen) {
    case Widen::U16: {
      auto* out = static_cast<int32_t*>(dst);
      for (int64_t i = 0; i < count; ++i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * (first + i), 2);
        out[i] = v;
      }
      return;
    }
    case Widen::U32: {
      auto* out = static_cast<int64_t*>(dst);
      for (int64_t i = 0; i < count; ++i) {
        uint32_t v;
        std::memcpy(&v, src + 4 * (first + i), 4);
        out[i] = v;
      }
      return;
    }
    case Widen::U64: {
      auto* out = static_cast<int64_t*>(dst);
      for (int64_t i = 0; i < count; ++i) {
        uint64_t v;
        std::memcpy(&v, src + 8 * (first + i), 8);
        KILN_CHECK(v <= static_cast<uint64_t>(INT64_MAX),
                   where << ": U64 value " << v << " at element " << first + i << " does not fit in int64");
        out[i] = static_cast<int64_t>(v);
      }
      return;
    }
    case Widen::F4E2M1: {
      // Two elements per byte, the first in the low nibble (torch's float4_e2m1fn_x2).
      auto* out = static_cast<bf16_t*>(dst);
      for (int64_t i = 0; i < count; ++i) {
        const uint64_t e = first + i;
        const auto byte = static_cast<uint8_t>(src[e / 2]);
        out[i] = f32_to_bf16(decode_small_float(Widen::F4E2M1, (e % 2 == 0 ? byte : byte >> 4) & 0xf));
      }
      return;
    }
    case Widen::F8E4M3:
    case Widen::F8E5M2:
      // The conversion of the fp8 weights Linear layers keep as stored (kiln/quant/storage_type.h).
      quant::dequantize_row(
          stored.widen == Widen::F8E4M3 ? quant::StorageType::F8_E4M3 : quant::StorageType::F8_E5M2,
          src + first, static_cast<bf16_t*>(dst), count);
      return;
    case Widen::None:
      break;
    default: {
      auto* out = static_cast<bf16_t*>(dst);
      for (int64_t i = 0; i < count; ++i)
        out[i] = f32_to_bf16(decode_small_float(stored.widen, static_cast<uint8_t>(src[first + i])));
      return;
    }
  }
  KILN_FAIL(where << ": internal: no conversion for stored dtype " << stored.name);
}

// A BOOL byte other than 0 or 1 is not a valid C++ bool: reject it rather than hand out undefined values.
void check_bools(const char* p, int64_t count, uint64_t first, const std::string& where) {
  for (int64_t i = 0; i < count; ++i)
    KILN_CHECK(static_cast<uint8_t>(p[i]) <= 1, where << ": BOOL element " << first + i << " has byte value "
                                                      << static_cast<int>(static_cast<uint8_t>(p[i]))
                                                      << " (expected 0 or 1)");
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), file_(MappedFile::open(path)) {
  const size_t size = file_->size();
  KILN_CHECK(size >= 8, path << ": not a safetensors file: " << size
                             << " bytes is shorter than the 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, file_->data(), 8);
  KILN_CHECK(header_len <= kMaxHeaderBytes, path << ": header length " << header_len << " exceeds the "
                                                 << kMaxHeaderBytes << "-byte limit (corrupt file?)");
  KILN_CHECK(header_len <= size - 8, path << ": truncated: header length " << header_len
                                          << " is larger than the file, which has only " << size - 8
                                          << " bytes after the length field");
  data_start_ = 8 + header_len;
  const uint64_t data_size = size - data_start_;

  check_json_depth(std::string_view(file_->data() + 8, header_len), path + ": header");
  nlohmann::json header =
      nlohmann::json::parse(file_->data() + 8, file_->data() + data_start_, nullptr, false);
  KILN_CHECK(!header.is_discarded(), path << ": header is not valid JSON");
  KILN_CHECK(header.is_object(),
             path << ": header is JSON but not an object (got " << header.type_name() << ")");

  std::vector<const TensorInfo*> by_offset;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      KILN_CHECK(entry.is_object(), path << ": __metadata__ must be an object of strings");
      for (auto& [k, v] : entry.items()) {
        KILN_CHECK(v.is_string(), path << ": __metadata__ value for '" << k << "' is not a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    KILN_CHECK(entry.is_object(), where << ": entry is not an object");
    KILN_CHECK(entry.contains("dtype") && entry["dtype"].is_string(),
               where << ": missing string field 'dtype'");
    KILN_CHECK(entry.contains("shape") && entry["shape"].is_array(),
               where << ": missing array field 'shape'");
    KILN_CHECK(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                   entry["data_offsets"].size() == 2,
               where << ": missing field 'data_offsets' of two integers");
    TensorInfo info;
    info.name = name;
    info.stored_dtype = entry["dtype"].get<std::string>();
    const StoredDType* stored = find_stored_dtype(info.stored_dtype);
    KILN_CHECK(info.stored_dtype != "C64",
               where << ": dtype C64 (complex64) is not supported: Kiln has no complex tensors");
    KILN_CHECK(stored != nullptr,
               where << ": unknown dtype '" << info.stored_dtype << "' (expected " << kKnownDTypes << ")");
    info.dtype = stored->read_as;
    ShapeBound bound;
    for (auto& d : entry["shape"]) {
      KILN_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                 where << ": shape entries must be non-negative integers, got " << entry["shape"].dump());
      // Each dimension is bounded on its own too: a zero elsewhere in the shape would hide a huge one.
      const uint64_t v = d.get<uint64_t>();
      KILN_CHECK(bound.add(v), where << ": shape " << entry["shape"].dump()
                                     << " is too large (overflows the element count)");
      info.shape.push_back(static_cast<int64_t>(v));
    }
    const uint64_t numel = bound.numel();
    for (auto& o : entry["data_offsets"])
      KILN_CHECK(
          o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
          where << ": data_offsets must be non-negative integers, got " << entry["data_offsets"].dump());
    info.begin = entry["data_offsets"][0].get<uint64_t>();
    info.end = entry["data_offsets"][1].get<uint64_t>();
    KILN_CHECK(info.begin <= info.end,
               where << ": data_offsets [" << info.begin << ", " << info.end << "] are reversed");
    KILN_CHECK(info.end <= data_size, where << ": data_offsets end " << info.end
                                            << " is past the end of the data section (" << data_size
                                            << " bytes; file truncated?)");
    uint64_t bits = 0;
    KILN_CHECK(!__builtin_mul_overflow(numel, stored->bits, &bits),
               where << ": shape " << entry["shape"].dump() << " is too large (overflows the byte count)");
    KILN_CHECK(bits % 8 == 0, where << ": shape " << shape_str(info.shape) << " of " << info.stored_dtype
                                    << " does not fill a whole number of bytes");
    KILN_CHECK(bits / 8 == info.end - info.begin,
               where << ": shape/size mismatch: shape " << shape_str(info.shape) << " of "
                     << info.stored_dtype << " needs " << bits / 8 << " bytes but data_offsets span "
                     << info.end - info.begin);
    auto [it, inserted] = infos_.emplace(name, std::move(info));
    by_offset.push_back(&it->second);
  }
  // The spec requires the tensors to tile the data section exactly: no overlap, no holes, nothing after.
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  for (const TensorInfo* info : by_offset) {
    KILN_CHECK(info->begin >= cursor, path << ": tensor '" << info->name
                                           << "' overlaps the previous tensor (starts at " << info->begin
                                           << ", previous ends at " << cursor << ")");
    KILN_CHECK(info->begin == cursor, path << ": gap in the data section before tensor '" << info->name
                                           << "' (bytes " << cursor << " to " << info->begin
                                           << " belong to no tensor)");
    cursor = info->end;
    names_.push_back(info->name);
  }
  KILN_CHECK(cursor == data_size,
             path << ": " << data_size - cursor << " bytes after the last tensor belong to no tensor");
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  KILN_CHECK(it != infos_.end(),
             path_ << ": no tensor named '" << name << "' (the file has " << infos_.size() << " tensors)");
  return it->second;
}

const char* SafetensorsFile::tensor_bytes(const TensorInfo& info) const {
  return file_->data() + data_start_ + info.begin;
}

uint64_t SafetensorsFile::file_size() const {
  return file_->size();
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& i = info(name);
  return rows(name, 0, i.shape.empty() ? 1 : i.shape[0]);
}

Tensor SafetensorsFile::rows(const std::string& name, int64_t start, int64_t end) const {
  const TensorInfo& i = info(name);
  const std::string where = path_ + ": tensor '" + name + "'";
  const int64_t n0 = i.shape.empty() ? 1 : i.shape[0];
  KILN_CHECK(0 <= start && start <= end && end <= n0,
             where << ": rows [" << start << ", " << end << ") out of range for dimension 0 of size " << n0);
  Shape shape = i.shape;
  if (!shape.empty()) shape[0] = end - start;
  const int64_t row_elems = i.shape.empty() ? 1 : shape_numel(Shape(i.shape.begin() + 1, i.shape.end()));
  const StoredDType& stored = *find_stored_dtype(i.stored_dtype);
  const uint64_t first = static_cast<uint64_t>(start * row_elems);
  const int64_t count = (end - start) * row_elems;
  if (stored.widen == Widen::None) {
    const size_t bytes = stored.bits / 8;
    const char* src = tensor_bytes(i) + first * bytes;
    if (i.dtype == DType::Bool) check_bools(src, count, first, where);
    // Zero-copy when aligned for the element type; unaligned views would be undefined behaviour.
    if (reinterpret_cast<uintptr_t>(src) % bytes == 0) {
      auto storage = Storage::borrow_file_pages(src, static_cast<size_t>(count) * bytes, cpu, file_);
      return Tensor(storage, shape, contiguous_strides(shape), 0, i.dtype);
    }
    return Tensor::from_blob(src, shape, i.dtype);
  }
  Tensor out = Tensor::empty(shape, i.dtype);
  widen(stored, tensor_bytes(i), first, count, out.raw_data(), where);
  return out;
}

Tensor SafetensorsFile::stored_bytes(const std::string& name) const {
  const TensorInfo& i = info(name);
  const StoredDType& stored = *find_stored_dtype(i.stored_dtype);
  KILN_CHECK(stored.bits % 8 == 0, path_ << ": tensor '" << name << "' is stored as " << i.stored_dtype
                                         << ", which packs several elements per byte");
  const int64_t cols = i.shape.empty() ? 1 : i.shape.back();
  const int64_t rows = i.shape.empty() ? 1 : shape_numel(Shape(i.shape.begin(), i.shape.end() - 1));
  const Shape shape{rows, cols * static_cast<int64_t>(stored.bits / 8)};
  auto storage =
      Storage::borrow_file_pages(tensor_bytes(i), static_cast<size_t>(shape_numel(shape)), cpu, file_);
  return Tensor(storage, shape, contiguous_strides(shape), 0, DType::UInt8);
}

Tensor SafetensorsFile::columns(const std::string& name, int64_t start, int64_t end) const {
  const TensorInfo& i = info(name);
  const std::string where = path_ + ": tensor '" + name + "'";
  KILN_CHECK(!i.shape.empty(), where << " is a scalar and has no columns");
  const int64_t n = i.shape.back();
  KILN_CHECK(0 <= start && start <= end && end <= n, where << ": columns [" << start << ", " << end
                                                           << ") out of range for last dimension of size "
                                                           << n);
  const StoredDType& stored = *find_stored_dtype(i.stored_dtype);
  if (stored.widen == Widen::None) return tensor(name).slice(-1, start, end);
  // Widened dtypes: convert only the selected columns, row by row.
  Shape shape = i.shape;
  shape.back() = end - start;
  Tensor out = Tensor::empty(shape, i.dtype);
  const int64_t rows = shape_numel(i.shape) / std::max<int64_t>(n, 1);
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t r = 0; r < rows; ++r)
    widen(stored, tensor_bytes(i), static_cast<uint64_t>(r * n + start), end - start,
          dst + static_cast<size_t>(r * (end - start)) * out.element_size(), where);
  return out;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(t.defined(), "save_safetensors: " << path << ": tensor '" << name << "' is undefined");
    KILN_CHECK(name != "__metadata__", "save_safetensors: " << path << ": '__metadata__' is reserved");
    KILN_CHECK(!header.contains(name),
               "save_safetensors: " << path << ": duplicate tensor name '" << name << "'");
    Tensor c = t.contiguous();
    header[name] = {{"dtype", stored_name(c.dtype())},
                    {"shape", c.shape()},
                    {"data_offsets", {offset, offset + c.nbytes()}}};
    offset += c.nbytes();
    contiguous.push_back(c);
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');  // keep the data section 8-byte aligned
  AtomicFile out(path);
  const uint64_t len = text.size();
  out.write(&len, 8);
  out.write(text.data(), text.size());
  for (const Tensor& c : contiguous) {
    synchronize(c.device());
    out.write(c.raw_data(), c.nbytes());
  }
  out.commit();
}

}  // namespace kiln::io
