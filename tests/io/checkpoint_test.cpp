// Sharded checkpoints (index.json -> shards) and finding the weights of a component folder.
#include "kiln/io/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "io/io_test_util.h"
#include "support/test_data.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using io::Checkpoint;
using testing::data_path;
using testing::temp_dir;
using testing::write_text;

const std::string kSharded = "io/sharded-transformer/diffusion_pytorch_model.safetensors.index.json";
const std::string kSingle = "models/tiny-dit/transformer/diffusion_pytorch_model.safetensors";

TEST(Checkpoint, ShardedIndexWrittenByDiffusersMatchesTheSingleFile) {
  const Checkpoint sharded(data_path(kSharded));
  const Checkpoint single(data_path(kSingle));
  EXPECT_TRUE(sharded.sharded());
  EXPECT_FALSE(single.sharded());
  EXPECT_EQ(sharded.shards().size(), 2u);
  EXPECT_EQ(single.shards().size(), 1u);
  EXPECT_EQ(sharded.metadata().at("total_size"), "12280");
  ASSERT_EQ(sharded.names(), single.names());
  EXPECT_EQ(sharded.names().size(), 62u);
  for (const auto& name : single.names()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(sharded.info(name).shape, single.info(name).shape);
    EXPECT_TRUE(testing::all_close(sharded.tensor(name), single.tensor(name), 0, 0));
  }
  // Tensors from both shards are reachable, and slices go to the right shard.
  EXPECT_NE(&sharded.file_of("context_embedder.weight"), &sharded.file_of("proj_out.weight"));
  EXPECT_TRUE(
      testing::all_close(sharded.rows("proj_out.weight", 1, 3), single.rows("proj_out.weight", 1, 3), 0, 0));
  EXPECT_TRUE(testing::all_close(sharded.columns("proj_out.weight", 2, 5),
                                 single.columns("proj_out.weight", 2, 5), 0, 0));
  EXPECT_EQ(sharded.bytes_on_disk(),
            fs::file_size(sharded.shards()[0]->path()) + fs::file_size(sharded.shards()[1]->path()));
  EXPECT_KILN_ERROR(sharded.tensor("missing.weight"), kSharded, "no tensor named 'missing.weight'");
}

// A two-shard checkpoint written here, with an index text the test controls.
struct ShardedFixture {
  std::string dir;
  explicit ShardedFixture(const std::string& name) : dir(temp_dir(name)) {
    io::save_safetensors(dir + "/a.safetensors",
                         {{"x", Tensor::full({2, 3}, 1.0)}, {"y", Tensor::full({4}, 2.0)}});
    io::save_safetensors(dir + "/b.safetensors", {{"z", Tensor::full({5}, 3.0, bfloat16)}});
  }
  std::string index(const std::string& weight_map) const {
    const std::string path = dir + "/model.safetensors.index.json";
    write_text(path, R"({"metadata": {"total_size": 44, "format": "pt"}, "weight_map": )" + weight_map + "}");
    return path;
  }
};

TEST(Checkpoint, ValidatesTheIndexAgainstItsShards) {
  ShardedFixture f("ckpt_validate");
  const Checkpoint ok(f.index(R"({"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"})"));
  EXPECT_EQ(ok.names(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(ok.tensor("z").dtype(), bfloat16);
  EXPECT_EQ(ok.metadata().at("format"), "pt");

  std::string p = f.index(R"({"x": "a.safetensors", "z": "c.safetensors"})");
  EXPECT_KILN_ERROR(Checkpoint{p}, p, "shard 'c.safetensors'", "missing");
  p = f.index(R"({"x": "a.safetensors", "z": "a.safetensors"})");
  EXPECT_KILN_ERROR(Checkpoint{p}, p, "'z'", "shard 'a.safetensors'", "has no such tensor");
  p = f.index(R"({"x": "../a.safetensors"})");
  EXPECT_KILN_ERROR(Checkpoint{p}, p, "not a file name relative to the index");
  p = f.index(R"({"x": "/etc/passwd"})");
  EXPECT_KILN_ERROR(Checkpoint{p}, p, "not a file name relative to the index");
  p = f.index(R"({"x": 3})");
  EXPECT_KILN_ERROR(Checkpoint{p}, p, "'x'", "expected a file name");
  p = f.index(R"([1])");
  EXPECT_KILN_ERROR(Checkpoint{p}, p, "weight_map");
  write_text(f.dir + "/bad.index.json", "{not json");
  EXPECT_KILN_ERROR(Checkpoint{f.dir + "/bad.index.json"}, "bad.index.json", "not valid JSON");

  // The same tensor in two shards is ambiguous.
  io::save_safetensors(f.dir + "/b.safetensors",
                       {{"z", Tensor::full({5}, 3.0)}, {"x", Tensor::full({2, 3}, 1.0)}});
  p = f.index(R"({"x": "a.safetensors", "z": "b.safetensors"})");
  EXPECT_KILN_ERROR(Checkpoint{p}, p, "tensor 'x' appears in two shards", "a.safetensors", "b.safetensors");
}

TEST(Checkpoint, CorruptShardNamesTheShard) {
  ShardedFixture f("ckpt_corrupt_shard");
  testing::write_bytes(f.dir + "/b.safetensors", "garbage");
  const std::string p = f.index(R"({"x": "a.safetensors", "z": "b.safetensors"})");
  EXPECT_KILN_ERROR(Checkpoint{p}, "b.safetensors", "shorter than the 8-byte header");
}

TEST(Checkpoint, BadPaths) {
  const std::string dir = temp_dir("ckpt_paths");
  EXPECT_KILN_ERROR(Checkpoint{dir + "/none.safetensors"}, "none.safetensors", "no such checkpoint");
  EXPECT_KILN_ERROR(Checkpoint{dir}, dir, "is a directory");
}

TEST(FindCheckpoint, DiffusersAndTransformersNames) {
  const std::string dir = temp_dir("find_ckpt");
  const auto touch = [&](const std::string& name) {
    io::save_safetensors(dir + "/" + name, {{"w", Tensor::zeros({1})}});
  };
  EXPECT_EQ(io::find_checkpoint_if_any(dir), "");
  EXPECT_KILN_ERROR(io::find_checkpoint(dir), dir, "no weights", "diffusion_pytorch_model.safetensors",
                    "the folder is empty");
  write_text(dir + "/pytorch_model.bin", "pickle");
  EXPECT_KILN_ERROR(io::find_checkpoint(dir), "pytorch_model.bin", "safetensors only");
  fs::remove(dir + "/pytorch_model.bin");

  touch("model.safetensors");  // transformers naming
  EXPECT_EQ(io::find_checkpoint(dir), dir + "/model.safetensors");
  touch("diffusion_pytorch_model.safetensors");  // diffusers naming wins
  EXPECT_EQ(io::find_checkpoint(dir), dir + "/diffusion_pytorch_model.safetensors");
  write_text(dir + "/diffusion_pytorch_model.safetensors.index.json",
             "{}");  // the index wins, as in diffusers
  EXPECT_EQ(io::find_checkpoint(dir), dir + "/diffusion_pytorch_model.safetensors.index.json");

  // Variants only when asked for, in both the current and the older index naming.
  EXPECT_KILN_ERROR(io::find_checkpoint(dir, "fp16"), "no 'fp16' variant", "drop the variant");
  touch("diffusion_pytorch_model.fp16.safetensors");
  EXPECT_EQ(io::find_checkpoint(dir, "fp16"), dir + "/diffusion_pytorch_model.fp16.safetensors");
  EXPECT_EQ(io::find_checkpoint(dir), dir + "/diffusion_pytorch_model.safetensors.index.json");
  write_text(dir + "/diffusion_pytorch_model.fp16.safetensors.index.json", "{}");
  EXPECT_EQ(io::find_checkpoint(dir, "fp16"), dir + "/diffusion_pytorch_model.fp16.safetensors.index.json");
  write_text(dir + "/diffusion_pytorch_model.safetensors.index.fp16.json", "{}");
  EXPECT_EQ(io::find_checkpoint(dir, "fp16"), dir + "/diffusion_pytorch_model.safetensors.index.fp16.json");
  touch("model.bf16.safetensors");
  EXPECT_EQ(io::find_checkpoint(dir, "bf16"), dir + "/model.bf16.safetensors");

  EXPECT_KILN_ERROR(io::find_checkpoint(dir + "/model.safetensors"), "not a directory");
}

TEST(FindCheckpoint, BrokenSymlinkIsReported) {
  const std::string dir = temp_dir("find_ckpt_symlink");
  fs::create_symlink(dir + "/../blobs/gone", dir + "/diffusion_pytorch_model.safetensors");
  EXPECT_KILN_ERROR(io::find_checkpoint(dir), "diffusion_pytorch_model.safetensors", "broken symlink");
}

}  // namespace
}  // namespace kiln
