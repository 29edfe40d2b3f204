// Every input under fuzz/crashes/ that once crashed a loader is replayed here as a named test, with the error
// it must give now (docs/reliability.md lists each finding and its fix). These also run under ASan/UBSan.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/io_test_util.h"
#include "kiln/io/checkpoint.h"
#include "kiln/io/gguf.h"
#include "kiln/io/json_config.h"
#include "kiln/io/png.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux_transformer.h"
#include "support/test_data.h"

namespace kiln {
namespace {

std::string reproducer(const std::string& target, const std::string& name) {
  return testing::data_path("../../fuzz/crashes/" + target + "/" + name);
}

// JSON nested 100000 levels deep parsed fine, then overflowed the stack when an error message printed it.
TEST(FuzzRegressions, SafetensorsHeaderNestedTooDeep) {
  const std::string path = reproducer("safetensors", "json-nested-100000-deep-in-shape");
  EXPECT_KILN_ERROR(io::SafetensorsFile{path}, path, "header: JSON nested deeper than 64 levels at byte");
}

TEST(FuzzRegressions, CheckpointIndexNestedTooDeep) {
  const std::string index = testing::temp_dir("fuzz_index_depth") + "/model.safetensors.index.json";
  std::filesystem::copy_file(reproducer("checkpoint_index", "json-nested-100000-deep-in-weight-map"), index);
  EXPECT_KILN_ERROR(io::Checkpoint{index}, index, "JSON nested deeper than 64 levels");
}

TEST(FuzzRegressions, ConfigNestedTooDeep) {
  const std::string path = reproducer("config_json", "json-nested-100000-deep-value");
  EXPECT_KILN_ERROR(io::JsonConfig::load(path), path, "JSON nested deeper than 64 levels");
  EXPECT_KILN_ERROR(models::FluxTransformerConfig::from_file(path), "JSON nested deeper than 64 levels");
}

// A number too large for a double made nlohmann throw out_of_range, which escaped as a foreign exception
// without the file's name (found by the config_json fuzzer in its first campaign hour).
TEST(FuzzRegressions, ConfigNumberBeyondDouble) {
  for (const char* name : {"number-beyond-double-1e6666666666666", "number-beyond-double-in-extra-ids"}) {
    const std::string path = reproducer("config_json", name);
    EXPECT_KILN_ERROR(io::JsonConfig::load(path), path, "not valid JSON", "number overflow");
  }
}

// FLUX.2's text encoder config had no upper bounds, and with num_attention_heads 0 and no head_dim the
// default head_dim divided by zero (SIGFPE) before the positivity check (found by review when the FLUX.2
// readers joined the config_json target).
TEST(FuzzRegressions, DecoderTextEncoderConfigSizes) {
  std::string path = reproducer("config_json", "qwen3-zero-heads-without-head-dim");
  EXPECT_KILN_ERROR(models::DecoderTextEncoderConfig::from_file(path), "num_attention_heads",
                    "must be positive, got 0");
  path = reproducer("config_json", "qwen3-2-to-the-40-layers");
  EXPECT_KILN_ERROR(models::DecoderTextEncoderConfig::from_file(path), path,
                    "num_hidden_layers 1099511627776 exceeds the maximum 1024");
}

// AutoencoderKLFlux2's decoder_block_out_channels were checked against norm_num_groups only: 2^62 channels
// overflowed the weight shapes (found by review).
TEST(FuzzRegressions, Flux2VaeDecoderWidth) {
  const std::string path = reproducer("config_json", "flux2-vae-decoder-width-2-to-the-62");
  EXPECT_KILN_ERROR(models::AutoencoderKLConfig::from_file(path), path,
                    "decoder_block_out_channels entry 4611686018427387904 exceeds the maximum 1048576");
}

// A reference image's header of 900000 x 900000 RGBA pixels (within libpng's own limit of 10^6 a side)
// asked for 3.2 TB before a single row was read (found by review when --image joined kiln generate).
TEST(FuzzRegressions, PngSideAboveTheLimit) {
  const std::string path = reproducer("png", "900000-square-rgba-header");
  EXPECT_KILN_ERROR(io::read_png(path), path, "900000x900000 pixels exceeds the maximum side 16384");
}

// A 377-byte PNG whose tEXt chunk declares 1.8 GB: libpng allocated the declared length before reading it
// (its chunk limit only warns on read); the chunk lengths are now checked against the file first.
TEST(FuzzRegressions, PngChunkLongerThanTheFile) {
  const std::string path = reproducer("png", "text-chunk-of-1.8-gb");
  EXPECT_KILN_ERROR(io::read_png(path), path,
                    "chunk 'tEXt' at byte 33 declares 1852797449 bytes but the file has 332 left");
}

// A GGUF tensor with a zero dimension and a row of 2^61 F32 elements: empty, so its 0 bytes passed the file's
// bounds, but sizing its rows multiplied 2^61 by 4 in int64 (signed overflow; found by the gguf fuzzer in the
// campaign's second session).
// (Refused since by the extent bound below, before its rows are sized.)
TEST(FuzzRegressions, GgufRowBytesOverflow) {
  const std::string path = reproducer("gguf", "row-of-2-to-the-61-f32-in-an-empty-tensor");
  EXPECT_KILN_ERROR(io::GgufFile{path}, path, "dimensions overflow the element count");
}

// The same with the 2^61 in an outer dimension: the row check passed, and copying the empty tensor multiplied
// its 2^61-element stride by 4 in int64 (found by the gguf fuzzer in CI, 2026-12-03). The readers (GGUF and
// safetensors) now bound the product of the dimensions with zeros counted as one, a tensor's largest stride.
TEST(FuzzRegressions, GgufEmptyTensorStrideOverflow) {
  const std::string path = reproducer("gguf", "outer-dimension-of-2-to-the-61-in-an-empty-tensor");
  EXPECT_KILN_ERROR(io::GgufFile{path}, path, "dimensions overflow the element count");
}

}  // namespace
}  // namespace kiln
