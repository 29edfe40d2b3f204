// The safetensors reader against files written by Python's safetensors
// (tools/io_refs/make_safetensors_fixtures.py) and against corrupt files built here by editing good ones.
// Runs under ASan+UBSan in CI.
#include "kiln/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "io/io_test_util.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using io::SafetensorsFile;
using testing::all_close;
using testing::data_path;
using testing::read_bytes;
using testing::temp_dir;
using testing::write_bytes;

const std::string kDtypesFile = "io/dtypes.safetensors";

SafetensorsFile& fixture() {
  static SafetensorsFile f(data_path(kDtypesFile));
  return f;
}
SafetensorsFile& expected() {
  static SafetensorsFile f(data_path("io/expected.safetensors"));
  return f;
}

// Exact element-by-element equality (NaN matches NaN), through double for floats and int64 for integers.
::testing::AssertionResult same_values(const Tensor& actual, const Tensor& reference) {
  if (actual.shape() != reference.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(actual.shape()) << " vs " << shape_str(reference.shape());
  if (is_floating(reference.dtype())) return all_close(actual, reference, 0.0, 0.0);
  const auto a = actual.to_vector<int64_t>();
  const auto e = reference.to_vector<int64_t>();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != e[i])
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << e[i];
  return ::testing::AssertionSuccess();
}

TEST(SafetensorsReader, ReadsEveryDtypeWrittenByPython) {
  const struct {
    const char* name;
    const char* stored;
    DType dtype;
  } cases[] = {
      {"f64", "F64", float64},
      {"f32", "F32", float32},
      {"f16", "F16", float16},
      {"bf16", "BF16", bfloat16},
      {"f16_3d", "F16", float16},
      {"i64", "I64", int64},
      {"i32", "I32", int32},
      {"i16", "I16", int16},
      {"i8", "I8", int8},
      {"u8", "U8", uint8},
      {"u16", "U16", int32},
      {"u32", "U32", int64},
      {"u64", "U64", int64},
      {"bool", "BOOL", boolean},
      {"f8_e4m3", "F8_E4M3", bfloat16},
      {"f8_e5m2", "F8_E5M2", bfloat16},
      {"f8_e4m3fnuz", "F8_E4M3FNUZ", bfloat16},
      {"f8_e5m2fnuz", "F8_E5M2FNUZ", bfloat16},
      {"f8_e8m0", "F8_E8M0", bfloat16},
      {"f4", "F4", bfloat16},
      {"scalar_f32", "F32", float32},
      {"scalar_i64", "I64", int64},
      {"empty_f32", "F32", float32},
      {"empty_bf16", "BF16", bfloat16},
      {"empty_f8", "F8_E4M3", bfloat16},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto& info = fixture().info(c.name);
    EXPECT_EQ(info.stored_dtype, c.stored);
    EXPECT_EQ(info.dtype, c.dtype);
    const Tensor t = fixture().tensor(c.name);
    EXPECT_EQ(t.dtype(), c.dtype);
    EXPECT_EQ(t.shape(), info.shape);
    EXPECT_TRUE(same_values(t, expected().tensor(c.name)));
  }
  EXPECT_EQ(fixture().info("scalar_f32").shape, Shape{});
  EXPECT_EQ(fixture().tensor("scalar_f32").item(), 2.5);
  EXPECT_EQ(fixture().info("empty_bf16").shape, (Shape{3, 0}));
  EXPECT_EQ(fixture().info("f4").shape, (Shape{4, 8}));
}

TEST(SafetensorsReader, MetadataNamesAndSizes) {
  const auto& md = fixture().metadata();
  ASSERT_EQ(md.size(), 2u);
  EXPECT_EQ(md.at("format"), "pt");
  EXPECT_EQ(md.at("source"), "kiln fixtures");
  EXPECT_FALSE(fixture().contains("__metadata__"));
  EXPECT_EQ(fixture().names().size(), 26u);
  // names() is in file order: data offsets increase.
  for (size_t i = 1; i < fixture().names().size(); ++i)
    EXPECT_LE(fixture().info(fixture().names()[i - 1]).end, fixture().info(fixture().names()[i]).begin);
  EXPECT_EQ(fixture().file_size(), std::filesystem::file_size(data_path(kDtypesFile)));
  EXPECT_KILN_ERROR(fixture().info("nope"), kDtypesFile, "no tensor named 'nope'");
}

TEST(SafetensorsReader, NativeTensorsAreZeroCopyViewsOfTheMapping) {
  const Tensor a = fixture().tensor("f32");
  const Tensor b = fixture().tensor("f32");
  EXPECT_TRUE(a.storage()->is_borrowed());
  EXPECT_EQ(a.raw_data(), b.raw_data());  // the same mapped bytes, not two copies
  EXPECT_FALSE(fixture().tensor("f8_e4m3").storage()->is_borrowed());  // widened: a converted copy
}

// stored_bytes: the bytes as the file holds them, one row per index before the last dimension, zero-copy.
TEST(SafetensorsReader, StoredBytesAreTheFilesBytesUnwidened) {
  const Tensor f8 = fixture().stored_bytes("f8_e4m3");
  EXPECT_EQ(f8.dtype(), uint8);
  EXPECT_EQ(f8.shape(), (Shape{16, 16}));
  EXPECT_TRUE(f8.storage()->is_file_pages());
  const std::vector<uint8_t> bytes = f8.to_vector<uint8_t>();
  for (size_t i = 0; i < bytes.size(); ++i) EXPECT_EQ(bytes[i], i) << i;  // the fixture's every-byte table

  const Tensor bf16 = fixture().tensor("bf16");
  const Tensor raw = fixture().stored_bytes("bf16");
  EXPECT_EQ(raw.shape(), (Shape{bf16.size(0), 2 * bf16.size(1)}));
  EXPECT_EQ(std::memcmp(raw.raw_data(), bf16.contiguous().raw_data(), bf16.nbytes()), 0);
  EXPECT_EQ(fixture().stored_bytes("scalar_f32").shape(), (Shape{1, 4}));
  EXPECT_EQ(fixture().stored_bytes("empty_f8").shape(), (Shape{0, 4}));
  EXPECT_KILN_ERROR(fixture().stored_bytes("f4"), kDtypesFile, "tensor 'f4'", "F4",
                    "packs several elements per byte");
}

TEST(SafetensorsReader, RowSlicesReadOnlyTheirRows) {
  for (const char* name : {"f64", "f32", "bf16", "f16_3d", "i16", "u16", "u32", "u64", "bool", "f8_e4m3",
                           "f8_e5m2", "f8_e8m0", "f4"}) {
    SCOPED_TRACE(name);
    const Tensor all = expected().tensor(name);
    const int64_t n = all.size(0);
    for (auto [s, e] : {std::pair<int64_t, int64_t>{0, 1}, {1, n}, {n - 1, n}, {1, 1}, {0, n}}) {
      const Tensor r = fixture().rows(name, s, e);
      EXPECT_TRUE(same_values(r, all.slice(0, s, e).contiguous())) << "rows " << s << ".." << e;
    }
  }
  // A native row slice borrows exactly the bytes of its rows from the mapping.
  const Tensor r = fixture().rows("f32", 2, 4);
  EXPECT_TRUE(r.storage()->is_borrowed());
  EXPECT_EQ(r.storage()->bytes(), 2u * 7 * sizeof(float));
  EXPECT_EQ(static_cast<const char*>(r.raw_data()),
            static_cast<const char*>(fixture().tensor("f32").raw_data()) + 2 * 7 * sizeof(float));
  // Rows 0..1 of u64_big convert; row 2 holds 2^64-1 and must not be touched by a slice that excludes it.
  EXPECT_TRUE(same_values(fixture().rows("u64_big", 0, 2), expected().tensor("u64_big")));
  EXPECT_KILN_ERROR(fixture().tensor("u64_big"), kDtypesFile, "'u64_big'", "does not fit in int64");
  EXPECT_KILN_ERROR(fixture().rows("f32", 3, 9), kDtypesFile, "'f32'", "rows [3, 9) out of range");
  EXPECT_KILN_ERROR(fixture().rows("f32", 2, 1), "out of range");
}

TEST(SafetensorsReader, ColumnSlicesSelectTheLastDimension) {
  for (const char* name : {"f64", "f32", "bf16", "f16_3d", "i8", "u16", "u64", "bool", "f8_e4m3fnuz",
                           "f8_e5m2fnuz", "f4", "empty_bf16"}) {
    SCOPED_TRACE(name);
    const Tensor all = expected().tensor(name);
    const int64_t n = all.shape().back();
    for (auto [s, e] : {std::pair<int64_t, int64_t>{0, n}, {n / 2, n}, {0, (n + 1) / 2}, {n / 3, n / 3}}) {
      const Tensor c = fixture().columns(name, s, e);
      EXPECT_TRUE(same_values(c, all.slice(-1, s, e).contiguous())) << "columns " << s << ".." << e;
    }
  }
  // F4 columns starting at an odd element begin inside a byte.
  EXPECT_TRUE(
      same_values(fixture().columns("f4", 3, 6), expected().tensor("f4").slice(-1, 3, 6).contiguous()));
  // Column 0 of u64_big is small everywhere; column 1 holds the value that does not fit.
  EXPECT_TRUE(
      same_values(fixture().columns("u64_big", 0, 1), Tensor::from_vector<int64_t>({1, 4, 0}, {3, 1})));
  EXPECT_KILN_ERROR(fixture().columns("u64_big", 1, 2), "does not fit in int64");
  EXPECT_KILN_ERROR(fixture().columns("scalar_f32", 0, 1), kDtypesFile, "'scalar_f32'", "scalar");
  EXPECT_KILN_ERROR(fixture().columns("f32", 0, 8),
                    "columns [0, 8) out of range for last dimension of size 7");
}

TEST(SafetensorsReader, TensorsOutliveTheFileObject) {
  Tensor t;
  {
    SafetensorsFile f(data_path(kDtypesFile));
    t = f.tensor("bf16");
  }
  EXPECT_TRUE(same_values(t, expected().tensor("bf16")));
}

TEST(SafetensorsWriter, RoundTripsEveryKilnDtype) {
  const std::string path = temp_dir("st_writer") + "/out.safetensors";
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType d : {float32, bfloat16, float16, float64, int64, int32, int16, int8, uint8, boolean})
    tensors.emplace_back(std::string(dtype_name(d)), Tensor::arange(6).reshape({2, 3}).to(d));
  tensors.emplace_back("strided", Tensor::arange(12, float32).reshape({3, 4}).transpose(0, 1));
  tensors.emplace_back("scalar", Tensor::full({}, 3.0));
  io::save_safetensors(path, tensors, {{"k", "v"}});
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("k"), "v");
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    EXPECT_EQ(f.info(name).dtype, t.dtype());
    EXPECT_TRUE(all_close(f.tensor(name), t, 0, 0));
  }
  // The data section starts 8-byte aligned, so every native tensor is a zero-copy view.
  EXPECT_TRUE(f.tensor("float64").storage()->is_borrowed());
  EXPECT_KILN_ERROR(io::save_safetensors(path, {{"a", Tensor::zeros({1})}, {"a", Tensor::zeros({1})}}), path,
                    "duplicate tensor name 'a'");
}

TEST(SafetensorsWriter, FailedWriteLeavesNoFile) {
  const std::string dir = temp_dir("st_writer_fail");
  std::filesystem::create_directory(dir + "/taken");
  EXPECT_KILN_ERROR(io::save_safetensors(dir + "/taken", {{"a", Tensor::zeros({4})}}), "taken", "directory");
  EXPECT_KILN_ERROR(io::save_safetensors(dir + "/missing/x.safetensors", {{"a", Tensor::zeros({4})}}),
                    "missing/x.safetensors", "does not exist");
  // An existing good file survives a failed overwrite untouched.
  io::save_safetensors(dir + "/good.safetensors", {{"a", Tensor::full({2}, 1.0)}});
  const std::string before = read_bytes(dir + "/good.safetensors");
  EXPECT_KILN_ERROR(io::save_safetensors(dir + "/good.safetensors", {{"a", Tensor()}}), "undefined");
  EXPECT_EQ(read_bytes(dir + "/good.safetensors"), before);
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 2u);  // "taken" and good.safetensors: no temporary files left behind
}

// ---- corrupt files

// A file with a given header text and `data_bytes` bytes of data, written to a temp dir.
std::string file_with_header(const std::string& name, const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(bytes.data(), &len, 8);
  bytes += header;
  bytes += std::string(data_bytes, '\x01');
  const std::string path = temp_dir("st_corrupt_" + name) + "/" + name + ".safetensors";
  write_bytes(path, bytes);
  return path;
}

std::string two_tensors(const std::string& a_offsets, const std::string& b_offsets,
                        const std::string& b_shape = "[3]", const std::string& b_dtype = "I8") {
  return R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":)" + a_offsets + R"(},"b":{"dtype":")" +
         b_dtype + R"(","shape":)" + b_shape + R"(,"data_offsets":)" + b_offsets + "}}";
}

TEST(SafetensorsCorrupt, ValidBaselineOpens) {
  // The corrupt cases below are small edits of this file, which must itself be fine.
  const std::string path = file_with_header("baseline", two_tensors("[0,16]", "[16,19]"), 19);
  SafetensorsFile f(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.tensor("b").to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1}));
}

TEST(SafetensorsCorrupt, TruncatedAtEveryKindOfCutPoint) {
  const std::string good = read_bytes(data_path(kDtypesFile));
  uint64_t header_len;
  std::memcpy(&header_len, good.data(), 8);
  const std::string dir = temp_dir("st_truncated");
  const struct {
    size_t cut;
    const char* problem;
  } cuts[] = {
      {0, "shorter than the 8-byte header length"},
      {5, "shorter than the 8-byte header length"},
      {8, "header length"},
      {8 + header_len / 2, "larger than the file"},
      {8 + header_len - 1, "larger than the file"},
      {8 + header_len, "past the end of the data section"},
      {8 + header_len + 100, "past the end of the data section"},
      {good.size() - 1, "past the end of the data section"},
  };
  for (const auto& c : cuts) {
    SCOPED_TRACE(c.cut);
    const std::string path = dir + "/cut_" + std::to_string(c.cut) + ".safetensors";
    write_bytes(path, good.substr(0, c.cut));
    EXPECT_KILN_ERROR(SafetensorsFile{path}, path, c.problem);
  }
  // Bytes appended after the last tensor are as wrong as bytes missing.
  const std::string longer = dir + "/longer.safetensors";
  write_bytes(longer, good + "xyz");
  EXPECT_KILN_ERROR(SafetensorsFile{longer}, longer, "3 bytes after the last tensor belong to no tensor");
}

TEST(SafetensorsCorrupt, HeaderLengthLargerThanTheFile) {
  std::string bytes = read_bytes(data_path(kDtypesFile));
  const std::string dir = temp_dir("st_header_len");
  for (uint64_t len : {uint64_t{bytes.size()}, uint64_t{1} << 26, uint64_t{1} << 40, ~uint64_t{0}}) {
    SCOPED_TRACE(len);
    std::memcpy(bytes.data(), &len, 8);
    const std::string path = dir + "/len.safetensors";
    write_bytes(path, bytes);
    EXPECT_KILN_ERROR(SafetensorsFile{path}, path, "header length", std::to_string(len));
  }
}

TEST(SafetensorsCorrupt, BadOffsets) {
  std::string p = file_with_header("overlap", two_tensors("[0,16]", "[13,16]"), 19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b' overlaps the previous tensor");
  p = file_with_header("gap", two_tensors("[0,16]", "[17,20]"), 20);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "gap in the data section before tensor 'b'", "16 to 17");
  p = file_with_header("past_end", two_tensors("[0,16]", "[16,19]"), 18);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "data_offsets end 19 is past the end");
  p = file_with_header("reversed", two_tensors("[0,16]", "[19,16]"), 19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "reversed");
  p = file_with_header("negative", two_tensors("[0,16]", "[-3,19]"), 19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "data_offsets must be non-negative integers");
  p = file_with_header("three", two_tensors("[0,16]", "[16,17,19]"), 19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "data_offsets");
  p = file_with_header("huge_offset", two_tensors("[0,16]", "[16,18446744073709551615]"), 19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "past the end");
}

TEST(SafetensorsCorrupt, BadDtypes) {
  std::string p = file_with_header("unknown", two_tensors("[0,16]", "[16,19]", "[3]", "F12"), 19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "unknown dtype 'F12'", "F8_E4M3");
  p = file_with_header("complex", two_tensors("[0,16]", "[16,40]", "[3]", "C64"), 40);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "C64", "not supported");
  p = file_with_header("no_dtype", R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'a'", "'dtype'");
  // Three F4 elements are a byte and a half.
  p = file_with_header("f4_odd", two_tensors("[0,16]", "[16,18]", "[3]", "F4"), 18);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "whole number of bytes");
}

TEST(SafetensorsCorrupt, BadJson) {
  std::string p = file_with_header("not_json", R"({"a":{"dtype":"F32",)", 0);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "not valid JSON");
  p = file_with_header("array", "[1,2,3]", 0);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "not an object");
  p = file_with_header("string", R"("hello")", 0);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "not an object");
  p = file_with_header("entry", R"({"a":5})", 0);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'a'", "not an object");
  p = file_with_header("metadata", R"({"__metadata__":{"k":1}})", 0);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "__metadata__", "'k'");
  // Deep nesting must be rejected without exhausting the stack (printing it for a message would not).
  p = file_with_header("deep", std::string(100000, '[') + std::string(100000, ']'), 0);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "JSON nested deeper than 64 levels");
  // An empty header object is a valid file with no tensors.
  p = file_with_header("empty", "{}", 0);
  EXPECT_TRUE(SafetensorsFile{p}.names().empty());
}

TEST(SafetensorsCorrupt, BadShapes) {
  std::string p = file_with_header("mismatch", two_tensors("[0,16]", "[16,19]", "[2,2]"), 19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "shape/size mismatch", "needs 4 bytes", "span 3");
  p = file_with_header("negative", two_tensors("[0,16]", "[16,19]", "[-3]"), 19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "non-negative integers");
  p = file_with_header("float", two_tensors("[0,16]", "[16,19]", "[3.0]"), 19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "non-negative integers");
  p = file_with_header("huge", two_tensors("[0,16]", "[16,19]", "[4611686018427387905]"), 19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "too large");
  p = file_with_header("overflow", two_tensors("[0,16]", "[16,19]", "[4294967296,4294967297]"), 19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "too large");
  // A zero dimension must not hide a dimension no int64 can hold.
  p = file_with_header("hidden", two_tensors("[0,16]", "[16,16]", "[0,18446744073709551615]"), 16);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "too large");
  // Nor one that fits int64 but whose stride, counted in bytes, would not (an empty tensor of 2^61 x 0).
  p = file_with_header("hidden_stride", two_tensors("[0,16]", "[16,16]", "[2305843009213693952,0]"), 16);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "too large");
  // 2^61 F64 elements fit the element bound but not the byte count.
  p = file_with_header("bytes_overflow", two_tensors("[0,16]", "[16,19]", "[2305843009213693952]", "F64"),
                       19);
  EXPECT_KILN_ERROR(SafetensorsFile{p}, p, "tensor 'b'", "too large");
}

TEST(SafetensorsCorrupt, InvalidBoolBytesAreRejectedWhenRead) {
  const std::string p = file_with_header("bool", two_tensors("[0,16]", "[16,19]", "[3]", "BOOL"), 19);
  std::string bytes = read_bytes(p);
  bytes[bytes.size() - 2] = 2;
  write_bytes(p, bytes);
  SafetensorsFile f(p);
  EXPECT_KILN_ERROR(f.tensor("b"), p, "tensor 'b'", "BOOL element 1 has byte value 2");
  bytes[bytes.size() - 2] = 0;
  write_bytes(p, bytes);
  EXPECT_EQ(SafetensorsFile(p).tensor("b").to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
}

TEST(SafetensorsCorrupt, NotAFile) {
  const std::string dir = temp_dir("st_not_a_file");
  EXPECT_KILN_ERROR(SafetensorsFile{dir}, dir, "not a regular file");
  EXPECT_KILN_ERROR(SafetensorsFile{dir + "/absent.safetensors"}, "absent.safetensors", "cannot open");
}

}  // namespace
}  // namespace kiln
