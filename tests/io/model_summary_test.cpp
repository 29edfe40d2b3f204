// summarize_model, the library side of `kiln info`, on the committed tiny pipeline and its sharded
// transformer.
#include "kiln/io/model_summary.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "io/io_test_util.h"
#include "support/test_data.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::data_path;

constexpr int64_t kTinyParams = 6140;  // FluxTransformer2DModel with the sizes in make_tiny_model.py

TEST(ModelSummary, Pipeline) {
  const auto s = io::summarize_model(data_path("models/tiny-dit"));
  EXPECT_EQ(s.kind, io::ModelSummary::Kind::Pipeline);
  EXPECT_EQ(s.class_name, "FluxPipeline");
  EXPECT_FALSE(s.source.from_cache());
  ASSERT_EQ(s.components.size(), 9u);
  int present = 0;
  for (const auto& c : s.components) {
    present += c.present;
    if (c.name == "transformer") {
      EXPECT_EQ(c.class_name, "FluxTransformer2DModel");
      EXPECT_EQ(c.library, "diffusers");
      ASSERT_TRUE(c.has_weights);
      EXPECT_EQ(c.weights.tensors, 62);
      EXPECT_EQ(c.weights.parameters, kTinyParams);
      EXPECT_EQ(c.weights.parameters_by_dtype.at("BF16"), kTinyParams);
      EXPECT_EQ(c.weights.bytes_in_memory, 2u * kTinyParams);
      EXPECT_EQ(c.weights.bytes_on_disk, fs::file_size(c.weights.path));
    } else if (c.name == "scheduler") {
      EXPECT_EQ(c.class_name, "FlowMatchEulerDiscreteScheduler");
      EXPECT_EQ(c.note, "scheduler");
      EXPECT_FALSE(c.has_weights);
    } else {
      EXPECT_FALSE(c.present) << c.name;
    }
  }
  EXPECT_EQ(present, 2);
  EXPECT_EQ(s.total.parameters, kTinyParams);
}

TEST(ModelSummary, ComponentFolderIndexAndFile) {
  const auto folder = io::summarize_model(data_path("io/sharded-transformer"));
  EXPECT_EQ(folder.kind, io::ModelSummary::Kind::Component);
  EXPECT_EQ(folder.class_name, "FluxTransformer2DModel");
  EXPECT_EQ(folder.components.front().weights.shards, 2);
  EXPECT_EQ(folder.total.parameters, kTinyParams);

  const auto index =
      io::summarize_model(data_path("io/sharded-transformer/diffusion_pytorch_model.safetensors.index.json"));
  EXPECT_EQ(index.kind, io::ModelSummary::Kind::Checkpoint);
  EXPECT_EQ(index.total.parameters, kTinyParams);

  // Small float formats take more memory than disk once widened to bfloat16.
  const auto file = io::summarize_model(data_path("io/dtypes.safetensors"));
  EXPECT_EQ(file.kind, io::ModelSummary::Kind::Checkpoint);
  EXPECT_EQ(file.total.parameters_by_dtype.at("F8_E4M3"), 256 + 0);
  EXPECT_EQ(file.total.parameters_by_dtype.at("F4"), 32);
  EXPECT_EQ(file.total.tensors, 26);

  // fp8 matrices (Linear weights) stay fp8 in memory: one byte each; the bf16 vectors two.
  const auto fp8 = io::summarize_model(data_path("gguf/flux-tiny-dev-bfl-fp8.safetensors"));
  const auto& by = fp8.total.parameters_by_dtype;
  EXPECT_EQ(fp8.total.bytes_in_memory,
            static_cast<uint64_t>(2 * by.at("BF16") + by.at("F8_E4M3") + by.at("F8_E5M2")));
  ASSERT_EQ(fp8.components.size(), 1u);
  const auto& matrices = fp8.components.front().weights.fp8_matrices;
  EXPECT_EQ(matrices.size(),
            36u);  // the file's Linear weights (kiln info's memory plan counts them at a byte)
  EXPECT_EQ(matrices.count("single_blocks.0.linear1.weight"), 1u);
  EXPECT_EQ(matrices.count("single_blocks.0.linear1.bias"), 0u);
}

TEST(ModelSummary, FromACachedRepo) {
  const std::string cache = testing::temp_dir("summary_cache");
  const std::string hash = "00000000000000000000000000000000000000aa";
  const fs::path repo = fs::path(cache) / "models--kiln--tiny-dit";
  fs::create_directories(repo / "refs");
  testing::write_text((repo / "refs" / "main").string(), hash);
  fs::create_directories(repo / "snapshots");
  fs::copy(data_path("models/tiny-dit"), repo / "snapshots" / hash, fs::copy_options::recursive);
  const auto s = io::summarize_model("kiln/tiny-dit", {.cache_dir = cache});
  EXPECT_TRUE(s.source.from_cache());
  EXPECT_EQ(s.source.commit, hash);
  EXPECT_EQ(s.class_name, "FluxPipeline");
  EXPECT_EQ(s.total.parameters, kTinyParams);
}

TEST(ModelSummary, Errors) {
  const std::string dir = testing::temp_dir("summary_errors");
  EXPECT_KILN_ERROR(io::summarize_model(dir), dir, "not a diffusers pipeline or component folder");
  testing::write_text(dir + "/notes.txt", "x");
  EXPECT_KILN_ERROR(io::summarize_model(dir + "/notes.txt"), "notes.txt", "expected a .safetensors file");
  testing::write_text(dir + "/config.json", R"({"_class_name": "X"})");
  EXPECT_KILN_ERROR(io::summarize_model(dir + "/config.json"), "config.json", "not a checkpoint index");
  // A component listed in model_index.json whose folder is missing is reported, not fatal.
  testing::write_text(dir + "/model_index.json",
                      R"({"_class_name": "FluxPipeline", "vae": ["diffusers", "AutoencoderKL"]})");
  const auto s = io::summarize_model(dir);
  ASSERT_EQ(s.components.size(), 1u);
  EXPECT_FALSE(s.components[0].present);
  EXPECT_EQ(s.components[0].note, "folder missing");
  EXPECT_EQ(s.components[0].class_name, "AutoencoderKL");
  EXPECT_KILN_ERROR(io::summarize_model(data_path("models/tiny-dit"), {}, "fp16"), "transformer",
                    "no 'fp16' variant");
}

}  // namespace
}  // namespace kiln
