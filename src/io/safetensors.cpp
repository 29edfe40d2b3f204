#include "kiln/io/safetensors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/mapped_file.h"
#include "kiln/core/device_runtime.h"

namespace kiln::io {

namespace {

// Headers of real checkpoints are a few hundred KB; anything this large is corrupt (the spec's own limit).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct StoredDType {
  const char* name;
  size_t bytes;
  DType read_as;
};

constexpr StoredDType kStoredDTypes[] = {
    {"F64", 8, DType::Float64},    {"F32", 4, DType::Float32},   {"F16", 2, DType::Float16},
    {"BF16", 2, DType::BFloat16},  {"I64", 8, DType::Int64},     {"I32", 4, DType::Int32},
    {"I16", 2, DType::Int16},      {"I8", 1, DType::Int8},       {"U8", 1, DType::UInt8},
    {"BOOL", 1, DType::Bool},      {"U16", 2, DType::Int32},     {"U32", 4, DType::Int64},
    {"U64", 8, DType::Int64},      {"F8_E4M3", 1, DType::BFloat16}, {"F8_E5M2", 1, DType::BFloat16},
};

const StoredDType* find_stored_dtype(const std::string& name) {
  for (const auto& d : kStoredDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

const char* stored_name(DType d) {
  switch (d) {
    case DType::Float64: return "F64";
    case DType::Float32: return "F32";
    case DType::Float16: return "F16";
    case DType::BFloat16: return "BF16";
    case DType::Int64: return "I64";
    case DType::Int32: return "I32";
    case DType::Int16: return "I16";
    case DType::Int8: return "I8";
    case DType::UInt8: return "U8";
    case DType::Bool: return "BOOL";
  }
  return "?";
}

bool stored_natively(const std::string& stored, DType read_as) { return stored == stored_name(read_as); }

float f8_e4m3_to_f32(uint8_t b) {
  const uint32_t sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 0x7;
  float mag;
  if (exp == 0xf && man == 0x7) mag = std::numeric_limits<float>::quiet_NaN();  // e4m3fn has no infinity
  else if (exp == 0) mag = std::ldexp(static_cast<float>(man), -9);
  else mag = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, static_cast<int>(exp) - 7);
  return sign ? -mag : mag;
}

float f8_e5m2_to_f32(uint8_t b) { return f16_to_f32(f16_t{static_cast<uint16_t>(b << 8)}); }

// Converts `count` stored elements into `dst` of the widened dtype.
void widen(const std::string& stored, const char* src, void* dst, int64_t count, const std::string& where) {
  if (stored == "F8_E4M3" || stored == "F8_E5M2") {
    auto* out = static_cast<bf16_t*>(dst);
    const bool e4m3 = stored == "F8_E4M3";
    for (int64_t i = 0; i < count; ++i) {
      const auto b = static_cast<uint8_t>(src[i]);
      out[i] = f32_to_bf16(e4m3 ? f8_e4m3_to_f32(b) : f8_e5m2_to_f32(b));  // exact: bf16 holds every f8 value
    }
  } else if (stored == "U16") {
    auto* out = static_cast<int32_t*>(dst);
    for (int64_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, src + 2 * i, 2);
      out[i] = v;
    }
  } else if (stored == "U32") {
    auto* out = static_cast<int64_t*>(dst);
    for (int64_t i = 0; i < count; ++i) {
      uint32_t v;
      std::memcpy(&v, src + 4 * i, 4);
      out[i] = v;
    }
  } else if (stored == "U64") {
    auto* out = static_cast<int64_t*>(dst);
    for (int64_t i = 0; i < count; ++i) {
      uint64_t v;
      std::memcpy(&v, src + 8 * i, 8);
      KILN_CHECK(v <= static_cast<uint64_t>(INT64_MAX),
                 where << ": U64 value " << v << " at element " << i << " does not fit in int64");
      out[i] = static_cast<int64_t>(v);
    }
  } else {
    KILN_FAIL(where << ": internal: no conversion for stored dtype " << stored);
  }
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), file_(MappedFile::open(path)) {
  const size_t size = file_->size();
  KILN_CHECK(size >= 8, path << ": not a safetensors file: " << size << " bytes is shorter than the 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, file_->data(), 8);
  KILN_CHECK(header_len <= kMaxHeaderBytes,
             path << ": header length " << header_len << " exceeds the " << kMaxHeaderBytes << "-byte limit (corrupt file?)");
  KILN_CHECK(header_len <= size - 8, path << ": truncated: header claims " << header_len << " bytes but the file has only "
                                          << size - 8 << " after the length field");
  data_start_ = 8 + header_len;
  const uint64_t data_size = size - data_start_;

  nlohmann::json header = nlohmann::json::parse(file_->data() + 8, file_->data() + data_start_, nullptr, false);
  KILN_CHECK(!header.is_discarded(), path << ": header is not valid JSON");
  KILN_CHECK(header.is_object(), path << ": header is JSON but not an object");

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
    KILN_CHECK(entry.contains("dtype") && entry["dtype"].is_string(), where << ": missing string field 'dtype'");
    KILN_CHECK(entry.contains("shape") && entry["shape"].is_array(), where << ": missing array field 'shape'");
    KILN_CHECK(entry.contains("data_offsets") && entry["data_offsets"].is_array() && entry["data_offsets"].size() == 2,
               where << ": missing field 'data_offsets' of two integers");
    TensorInfo info;
    info.name = name;
    info.stored_dtype = entry["dtype"].get<std::string>();
    const StoredDType* stored = find_stored_dtype(info.stored_dtype);
    KILN_CHECK(stored != nullptr, where << ": unknown dtype '" << info.stored_dtype
                                        << "' (expected F64, F32, F16, BF16, I64, I32, I16, I8, U8, U16, U32, U64, BOOL, F8_E4M3 or F8_E5M2)");
    info.dtype = stored->read_as;
    uint64_t numel = 1;
    for (auto& d : entry["shape"]) {
      KILN_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                 where << ": shape entries must be non-negative integers, got " << d.dump());
      const uint64_t v = d.get<uint64_t>();
      KILN_CHECK(!__builtin_mul_overflow(numel, v, &numel) && numel <= (1ull << 62),
                 where << ": shape " << entry["shape"].dump() << " is too large");
      info.shape.push_back(static_cast<int64_t>(v));
    }
    for (auto& o : entry["data_offsets"])
      KILN_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
                 where << ": data_offsets must be non-negative integers, got " << entry["data_offsets"].dump());
    info.begin = entry["data_offsets"][0].get<uint64_t>();
    info.end = entry["data_offsets"][1].get<uint64_t>();
    KILN_CHECK(info.begin <= info.end, where << ": data_offsets [" << info.begin << ", " << info.end << "] are reversed");
    KILN_CHECK(info.end <= data_size, where << ": data_offsets end " << info.end << " is past the end of the data ("
                                            << data_size << " bytes; file truncated?)");
    uint64_t expected = 0;
    KILN_CHECK(!__builtin_mul_overflow(numel, stored->bytes, &expected) && expected == info.end - info.begin,
               where << ": shape " << shape_str(info.shape) << " of " << info.stored_dtype << " needs "
                     << numel * stored->bytes << " bytes but data_offsets span " << info.end - info.begin);
    auto [it, inserted] = infos_.emplace(name, std::move(info));
    by_offset.push_back(&it->second);
  }
  // The spec requires the tensors to tile the data section exactly: no overlap, no holes, nothing after.
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  for (const TensorInfo* info : by_offset) {
    KILN_CHECK(info->begin >= cursor, path << ": tensor '" << info->name << "' overlaps the previous tensor (starts at "
                                           << info->begin << ", previous ends at " << cursor << ")");
    KILN_CHECK(info->begin == cursor, path << ": gap in the data section before tensor '" << info->name << "' (bytes "
                                           << cursor << " to " << info->begin << " belong to no tensor)");
    cursor = info->end;
    names_.push_back(info->name);
  }
  KILN_CHECK(cursor == data_size, path << ": " << data_size - cursor << " bytes after the last tensor belong to no tensor");
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  KILN_CHECK(it != infos_.end(), path_ << ": no tensor named '" << name << "' (the file has " << infos_.size() << " tensors)");
  return it->second;
}

const char* SafetensorsFile::tensor_bytes(const TensorInfo& info) const {
  return file_->data() + data_start_ + info.begin;
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
  const size_t stored_bytes = find_stored_dtype(i.stored_dtype)->bytes;
  const char* src = tensor_bytes(i) + static_cast<size_t>(start * row_elems) * stored_bytes;
  const int64_t count = (end - start) * row_elems;
  if (stored_natively(i.stored_dtype, i.dtype)) {
    // Zero-copy when aligned for the element type; unaligned views would be undefined behaviour.
    if (reinterpret_cast<uintptr_t>(src) % stored_bytes == 0) {
      auto storage = Storage::borrow(const_cast<char*>(src), static_cast<size_t>(count) * stored_bytes, cpu, file_);
      return Tensor(storage, shape, contiguous_strides(shape), 0, i.dtype);
    }
    return Tensor::from_blob(src, shape, i.dtype);
  }
  Tensor out = Tensor::empty(shape, i.dtype);
  widen(i.stored_dtype, src, out.raw_data(), count, where);
  return out;
}

Tensor SafetensorsFile::columns(const std::string& name, int64_t start, int64_t end) const {
  const TensorInfo& i = info(name);
  KILN_CHECK(!i.shape.empty(), path_ << ": tensor '" << name << "' is a scalar and has no columns");
  const int64_t n = i.shape.back();
  KILN_CHECK(0 <= start && start <= end && end <= n, path_ << ": tensor '" << name << "': columns [" << start << ", "
                                                           << end << ") out of range for last dimension of size " << n);
  if (stored_natively(i.stored_dtype, i.dtype)) return tensor(name).slice(-1, start, end);
  // Widened dtypes: convert only the selected columns, row by row.
  const size_t stored_bytes = find_stored_dtype(i.stored_dtype)->bytes;
  Shape shape = i.shape;
  shape.back() = end - start;
  Tensor out = Tensor::empty(shape, i.dtype);
  const int64_t rows = shape_numel(i.shape) / std::max<int64_t>(n, 1);
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t r = 0; r < rows; ++r) {
    widen(i.stored_dtype, tensor_bytes(i) + static_cast<size_t>(r * n + start) * stored_bytes,
          dst + static_cast<size_t>(r * (end - start)) * out.element_size(), end - start, path_ + ": tensor '" + name + "'");
  }
  return out;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(t.defined(), "save_safetensors: tensor '" << name << "' is undefined");
    KILN_CHECK(!header.contains(name), "save_safetensors: duplicate tensor name '" << name << "'");
    Tensor c = t.contiguous();
    header[name] = {{"dtype", stored_name(c.dtype())}, {"shape", c.shape()}, {"data_offsets", {offset, offset + c.nbytes()}}};
    offset += c.nbytes();
    contiguous.push_back(c);
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');  // keep the data section 8-byte aligned
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(out.good(), path << ": cannot open for writing");
    const uint64_t len = text.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const Tensor& c : contiguous) {
      synchronize(c.device());
      out.write(static_cast<const char*>(c.raw_data()), static_cast<std::streamsize>(c.nbytes()));
    }
    out.flush();
    if (!out.good()) {
      std::remove(tmp.c_str());
      KILN_FAIL(path << ": write failed");
    }
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace kiln::io
