// The GGUF reader: the committed file written by the gguf package reads back with its names, shapes, types
// and metadata; corrupt and truncated files fail with a kiln::Error that names the file, the tensor and the
// expectation, never with an out-of-bounds read (this suite also runs under ASan/UBSan).
#include <gtest/gtest.h>

#include <cstring>

#include "io/io_test_util.h"
#include "kiln/io/gguf.h"
#include "kiln/nn/gguf_weights.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using quant::StorageType;

// Builds GGUF bytes field by field, so each test can break exactly one thing.
class GgufBuilder {
 public:
  uint32_t version = 3;
  uint64_t alignment = 32;

  template <class T>
  static void put(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  static void put_string(std::string& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out += s;
  }
  void add_string(const std::string& key, const std::string& value) {
    put_string(kv_, key);
    put<uint32_t>(kv_, 8);
    put_string(kv_, value);
    ++n_kv_;
  }
  void add_u32(const std::string& key, uint32_t value) {
    put_string(kv_, key);
    put<uint32_t>(kv_, 4);
    put<uint32_t>(kv_, value);
    ++n_kv_;
  }
  // An array of int32 (as the gguf package writes a list of Python ints).
  void add_i32_array(const std::string& key, const std::vector<int32_t>& values) {
    put_string(kv_, key);
    put<uint32_t>(kv_, 9);
    put<uint32_t>(kv_, 5);
    put<uint64_t>(kv_, values.size());
    for (int32_t v : values) put<int32_t>(kv_, v);
    ++n_kv_;
  }
  // `ne` in ggml order (innermost first); the data follows the previous tensor's, aligned, unless `offset`
  // is given.
  void add_tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, const std::string& bytes,
                  std::optional<uint64_t> offset = std::nullopt) {
    while (data_.size() % alignment) data_.push_back('\0');
    put_string(infos_, name);
    put<uint32_t>(infos_, static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) put<uint64_t>(infos_, d);
    put<uint32_t>(infos_, type);
    put<uint64_t>(infos_, offset.value_or(data_.size()));
    data_ += bytes;
    ++n_tensors_;
  }
  std::string bytes() const {
    std::string out = "GGUF";
    put<uint32_t>(out, version);
    put<uint64_t>(out, n_tensors_);
    put<uint64_t>(out, n_kv_);
    out += kv_ + infos_;
    while (out.size() % alignment) out.push_back('\0');
    return out + data_;
  }

 private:
  std::string kv_, infos_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
};

std::string floats(std::initializer_list<float> v) {
  return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * sizeof(float));
}

// One Q8_0 block of 32 values: scale 0.5, values -16..15.
std::string q8_0_block() {
  std::string b(34, '\0');
  const uint16_t half_05 = 0x3800;
  std::memcpy(b.data(), &half_05, 2);
  for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<char>(i - 16);
  return b;
}

GgufBuilder valid_builder() {
  GgufBuilder g;
  g.add_string("general.architecture", "flux");
  g.add_tensor("bias", {3}, 0, floats({1.0f, 2.0f, 3.0f}));
  g.add_tensor("weight", {32, 2}, 8, q8_0_block() + q8_0_block());
  return g;
}

std::string write(const std::string& name, const std::string& bytes) {
  const std::string path = testing::temp_dir("gguf_test") + "/" + name;
  testing::write_bytes(path, bytes);
  return path;
}

TEST(Gguf, ReadsWhatTheGgufPackageWrote) {
  const io::GgufFile f(testing::data_path("gguf/quant_types.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.names().size(), 15u);
  EXPECT_EQ(f.names().front(), "t0.F32");
  EXPECT_EQ(f.metadata_string("general.architecture"), "kiln-test");
  EXPECT_EQ(f.metadata_string("kiln.note"), "quantization references");
  const io::GgufTensorInfo& q = f.info("t8.Q8_0");
  EXPECT_EQ(q.type, StorageType::Q8_0);
  EXPECT_EQ(q.shape, (Shape{2, 3, 32}));  // torch order, as the gguf package reports it reversed
  EXPECT_EQ(q.bytes, 6u * 34u);
  const quant::QuantizedTensor blocks = f.blocks("t8.Q8_0");
  EXPECT_EQ(blocks.blocks.shape(), (Shape{6, 34}));
  EXPECT_EQ(blocks.blocks.dtype(), uint8);
  // Plain float types are zero-copy views in their own dtype.
  EXPECT_EQ(f.tensor("t2.BF16").dtype(), bfloat16);
  EXPECT_EQ(f.tensor("t2.BF16").shape(), (Shape{3, 33}));
  EXPECT_TRUE(f.tensor("t0.F32").storage()->is_file_pages());
  EXPECT_KILN_ERROR(f.info("nope"), "quant_types.gguf", "no tensor named 'nope'");
}

TEST(Gguf, BuilderFileRoundTrips) {
  const io::GgufFile f(write("valid.gguf", valid_builder().bytes()));
  EXPECT_EQ(f.tensor("bias").to_vector<float>(), (std::vector<float>{1, 2, 3}));
  const std::vector<float> w = f.tensor("weight").to_vector<float>();
  ASSERT_EQ(w.size(), 64u);
  EXPECT_EQ(w[0], -8.0f);
  EXPECT_EQ(w[63], 7.5f);
}

TEST(Gguf, WeightSourceKeepsQuantizedBlocks) {
  const nn::GgufWeights source(write("valid.gguf", valid_builder().bytes()));
  EXPECT_EQ(source.shape("weight"), (Shape{2, 32}));
  EXPECT_TRUE(source.load_quantized("weight").defined());
  EXPECT_EQ(source.load_quantized("weight").type, StorageType::Q8_0);
  EXPECT_FALSE(source.load_quantized("bias").defined());
  EXPECT_EQ(source.load("weight").dtype(), float32);
}

TEST(Gguf, RejectsBadMagicAndVersions) {
  EXPECT_KILN_ERROR(io::GgufFile(write("magic.gguf", "GGUX" + std::string(60, '\0'))), "magic.gguf",
                    "not a GGUF file");
  GgufBuilder v1 = valid_builder();
  v1.version = 1;
  EXPECT_KILN_ERROR(io::GgufFile(write("v1.gguf", v1.bytes())), "version 1 is not supported");
  GgufBuilder swapped = valid_builder();
  swapped.version = 0x03000000;
  EXPECT_KILN_ERROR(io::GgufFile(write("be.gguf", swapped.bytes())), "big-endian");
  GgufBuilder v9 = valid_builder();
  v9.version = 9;
  EXPECT_KILN_ERROR(io::GgufFile(write("v9.gguf", v9.bytes())), "unsupported GGUF version 9");
}

TEST(Gguf, EveryTruncationIsAClearError) {
  const std::string bytes = valid_builder().bytes();
  for (size_t len = 0; len < bytes.size(); ++len) {
    const std::string path = write("cut.gguf", bytes.substr(0, len));
    try {
      io::GgufFile f(path);
      ADD_FAILURE() << "a file cut to " << len << " of " << bytes.size() << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cut.gguf"), std::string::npos) << e.what();
    }
  }
  EXPECT_KILN_ERROR(io::GgufFile(write("cut.gguf", bytes.substr(0, bytes.size() - 1))), "tensor 'weight'",
                    "past the end of the data section");
}

TEST(Gguf, CorruptBytesNeverReadOutOfBounds) {
  // Each header byte replaced by 0xff in turn: either the file still parses or it fails cleanly.
  const std::string bytes = valid_builder().bytes();
  for (size_t i = 0; i < bytes.size() - 68; ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(0xff);
    try {
      io::GgufFile f(write("flip.gguf", bad));
      for (const auto& name : f.names()) f.tensor(name);
    } catch (const Error&) {
    }
  }
}

TEST(Gguf, RejectsInconsistentTensorInfos) {
  {
    GgufBuilder g;
    g.add_tensor("q81", {32}, 9, std::string(36, '\0'));
    EXPECT_KILN_ERROR(io::GgufFile(write("type.gguf", g.bytes())), "tensor 'q81'",
                      "unsupported ggml type id 9", "Q8_0");
  }
  {
    GgufBuilder g;
    g.add_tensor("w", {33}, 8, std::string(34, '\0'));
    EXPECT_KILN_ERROR(io::GgufFile(write("row.gguf", g.bytes())), "tensor 'w'",
                      "33 elements is not a whole number of Q8_0 blocks of 32");
  }
  {
    GgufBuilder g;
    g.add_tensor("a", {4}, 0, floats({1, 2, 3, 4}));
    g.add_tensor("b", {4}, 0, floats({1, 2, 3, 4}), 8);
    EXPECT_KILN_ERROR(io::GgufFile(write("align.gguf", g.bytes())), "tensor 'b'",
                      "not a multiple of the alignment 32");
  }
  {
    GgufBuilder g;
    g.add_tensor("a", {16}, 0, std::string(64, '\0'));
    g.add_tensor("b", {4}, 0, floats({1, 2, 3, 4}), 32);
    EXPECT_KILN_ERROR(io::GgufFile(write("overlap.gguf", g.bytes())), "tensor 'b'", "overlaps tensor 'a'");
  }
  {
    GgufBuilder g;
    g.add_tensor("a", {4}, 0, floats({1, 2, 3, 4}));
    g.add_tensor("a", {4}, 0, floats({1, 2, 3, 4}));
    EXPECT_KILN_ERROR(io::GgufFile(write("dup.gguf", g.bytes())), "tensor 'a' appears twice");
  }
  {
    GgufBuilder g;
    g.add_tensor("five", {1, 1, 1, 1, 4}, 0, floats({1, 2, 3, 4}));
    EXPECT_KILN_ERROR(io::GgufFile(write("dims.gguf", g.bytes())), "tensor 'five'", "5 dimensions");
  }
  {
    GgufBuilder g;
    g.add_tensor("huge", {1ull << 40, 1ull << 40}, 0, "");
    EXPECT_KILN_ERROR(io::GgufFile(write("huge.gguf", g.bytes())), "tensor 'huge'", "overflow");
  }
}

TEST(Gguf, RejectsBadMetadata) {
  {
    GgufBuilder g;
    g.add_u32("general.alignment", 24);
    EXPECT_KILN_ERROR(io::GgufFile(write("a24.gguf", g.bytes())),
                      "general.alignment 24 is not a power of two");
  }
  {
    GgufBuilder g;
    g.add_string("k", "v");
    g.add_string("k", "w");
    EXPECT_KILN_ERROR(io::GgufFile(write("dupkey.gguf", g.bytes())), "metadata key 'k' appears twice");
  }
  {
    // A string whose length runs past the end of the file.
    std::string b = "GGUF";
    GgufBuilder::put<uint32_t>(b, 3);
    GgufBuilder::put<uint64_t>(b, 0);
    GgufBuilder::put<uint64_t>(b, 1);
    GgufBuilder::put<uint64_t>(b, 1ull << 60);
    b += "key" + std::string(20, 'x');
    EXPECT_KILN_ERROR(io::GgufFile(write("strlen.gguf", b)), "strlen.gguf", "truncated", "metadata key #0");
  }
  {
    // More tensors than the file could describe.
    std::string b = "GGUF";
    GgufBuilder::put<uint32_t>(b, 3);
    GgufBuilder::put<uint64_t>(b, 1ull << 50);
    GgufBuilder::put<uint64_t>(b, 0);
    EXPECT_KILN_ERROR(io::GgufFile(write("count.gguf", b)), "tensor infos cannot fit");
  }
  {
    // An array claiming more elements than bytes remain.
    GgufBuilder g;
    std::string b = "GGUF";
    GgufBuilder::put<uint32_t>(b, 3);
    GgufBuilder::put<uint64_t>(b, 0);
    GgufBuilder::put<uint64_t>(b, 1);
    GgufBuilder::put_string(b, "arr");
    GgufBuilder::put<uint32_t>(b, 9);
    GgufBuilder::put<uint32_t>(b, 6);
    GgufBuilder::put<uint64_t>(b, 1ull << 40);
    EXPECT_KILN_ERROR(io::GgufFile(write("arr.gguf", b)), "metadata 'arr'", "claims 1099511627776 elements");
  }
}

// city96's ComfyUI-GGUF stores some tensors reshaped to 256-wide rows and records the real shape under
// comfy.gguf.orig_shape.<name>: the tensor reads back in that shape, its blocks stay quantized when the real
// rows are whole blocks, and a recorded shape of another size is refused.
TEST(Gguf, ComfyOriginalShapesAreTheTensorsShapes) {
  const auto file = [](const std::vector<int32_t>& shape) {
    GgufBuilder g;
    g.add_i32_array("comfy.gguf.orig_shape.w", shape);
    g.add_tensor("w", {64, 1}, 8, q8_0_block() + q8_0_block());
    return g.bytes();
  };
  const nn::GgufWeights rows(write("orig_rows.gguf", file({2, 32})));
  EXPECT_EQ(rows.shape("w"), (Shape{2, 32}));
  const quant::QuantizedTensor q = rows.load_quantized("w");
  ASSERT_TRUE(q.defined());
  EXPECT_EQ(q.shape, (Shape{2, 32}));
  EXPECT_EQ(q.blocks.shape(), (Shape{2, 34}));
  const Tensor values = rows.load("w");
  EXPECT_EQ(values.shape(), (Shape{2, 32}));
  EXPECT_EQ(values.to_vector<float>(), q.dequantize().to_vector<float>());
  EXPECT_EQ(values.to_vector<float>()[33], -7.5f);  // the second block's second value: 0.5 * (1 - 16)

  // Rows of 16 are no whole Q8_0 blocks: plain values only.
  const nn::GgufWeights narrow(write("orig_narrow.gguf", file({4, 16})));
  EXPECT_EQ(narrow.shape("w"), (Shape{4, 16}));
  EXPECT_FALSE(narrow.load_quantized("w").defined());
  EXPECT_EQ(narrow.load("w").shape(), (Shape{4, 16}));

  EXPECT_KILN_ERROR(nn::GgufWeights(write("orig_bad.gguf", file({3, 32}))), "orig_bad.gguf",
                    "comfy.gguf.orig_shape.w gives [3, 32] for 'w', which holds [1, 64] values");
}

}  // namespace
}  // namespace kiln
