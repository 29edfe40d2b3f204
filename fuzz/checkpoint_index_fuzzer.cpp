// Sharded checkpoints: the *.safetensors.index.json (metadata, weight_map of tensor name -> shard file)
// next to two real shards, opened as diffusers opens a component folder (find_checkpoint, then Checkpoint).
// Shard names that climb out of the folder, missing shards, tensors in the wrong or in two shards must be
// refused.
#include <filesystem>

#include "fuzz_support.h"
#include "kiln/io/checkpoint.h"

using namespace kiln;

namespace {

const std::string& component_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const fs::path d = fs::path(fuzz::scratch_dir()) / "transformer";
    fs::create_directories(d);
    for (const char* shard : {"diffusion_pytorch_model-00001-of-00002.safetensors",
                              "diffusion_pytorch_model-00002-of-00002.safetensors"})
      fs::copy_file(fuzz::source_path("tests/data/io/sharded-transformer/") + shard, d / shard,
                    fs::copy_options::overwrite_existing);
    return d.string();
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::make_runtime_deterministic();
  component_dir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string index = component_dir() + "/diffusion_pytorch_model.safetensors.index.json";
  fuzz::write_file(index, {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean([&] {
    const std::string found = io::find_checkpoint(component_dir());
    fuzz::require(found == index, "find_checkpoint did not pick the index");
    const io::Checkpoint checkpoint(found);
    fuzz::require(checkpoint.shards().size() <= 2, "a shard that is not in the folder");
    for (const std::string& name : checkpoint.names()) {
      fuzz::require(checkpoint.contains(name), "a listed name that is not contained");
      const io::TensorInfo& info = checkpoint.info(name);
      fuzz::require(checkpoint.file_of(name).contains(name) && info.name == name,
                    "a name in the wrong shard");
    }
    fuzz::require(checkpoint.shards().empty() || checkpoint.bytes_on_disk() > 0, "shards without bytes");
  });
  return 0;
}
