// SD1.5 and SDXL UNets from fp8 and GGUF files (tools/goldens/sd_quantized.py): ComfyUI's fp8 checkpoints
// (every UNet tensor of 2+ dims float8_e4m3fn), stable-diffusion.cpp's `sd -M convert` output (its names, its
// rule of which tensors it quantizes: Linear weights and norm weights, 3x3 / 1x1 convolutions F16) and
// city96's UNet-only GGUFs (no model.diffusion_model. prefix, tensors reshaped to 256-rows with their real
// shape in comfy.gguf.orig_shape.*), each run as `--model FILE --config FOLDER` runs it. The images are
// diffusers' on the same values (from_single_file on the fp8 file itself; on the GGUF files dequantized by
// the gguf package) within one 8-bit level; the Linear weights stay quantized in memory where their rows are
// whole blocks. Truncated files, other families and unsupported quant types are refused naming them.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "families/stable_diffusion/sd_single_file.h"
#include "io/io_test_util.h"
#include "kiln/families/stable_diffusion/stable_diffusion_pipeline.h"
#include "kiln/families/stable_diffusion/stable_diffusion_xl_pipeline.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/nn/layers.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::GoldenFile;

std::string quantized_file(const std::string& name) {
  return testing::data_path("goldens/sd_quantized/" + name);
}

const models::UNet2DConditionModel& unet_of(const DiffusionPipeline& pipe) {
  if (const auto* xl = dynamic_cast<const StableDiffusionXLPipeline*>(&pipe)) return xl->unet();
  return dynamic_cast<const StableDiffusionPipeline&>(pipe).unet();
}

struct LinearCounts {
  int64_t linear = 0, quantized = 0;
  std::map<std::string, int64_t> types;  // storage type name -> quantized Linear weights
};

LinearCounts count_linears(const models::UNet2DConditionModel& unet) {
  LinearCounts c;
  for (const auto& [name, m] : const_cast<models::UNet2DConditionModel&>(unet).named_modules()) {
    const auto* linear = dynamic_cast<const nn::Linear*>(m);
    if (linear == nullptr) continue;
    ++c.linear;
    if (!linear->is_quantized()) continue;
    ++c.quantized;
    ++c.types[quant::traits(linear->weight_storage.type).name];
    // The weight holds its stored bytes, not float values.
    EXPECT_EQ(linear->weight.dtype(), uint8) << name;
  }
  return c;
}

struct Case {
  const char* file;
  const char* golden;
  const char* type;   // the storage type the quantized Linear weights keep (nullptr: none stay so)
  int64_t quantized;  // how many of the UNet's Linear layers keep it
};

// The Linear weights each file keeps quantized (counted independently from the files' tensor types): fp8
// files every 2-D one (SD1.5's proj_in / proj_out are 1x1 convolutions [C, C, 1, 1] there, widened at load
// like every convolution); stable-diffusion.cpp's those whose rows are whole 32-blocks outside time_embed /
// label_emb; ComfyUI-GGUF's Q8_0 those it quantized (more than 1024 values; reshaped or not, their real rows
// are whole 32-blocks); its Q4_K none (no Linear row of the tiny UNets is a multiple of 256 wide, so those
// tensors are dequantized at load).
const Case kCases[] = {
    {"sd15_tiny_fp8.safetensors", "sd15_fp8_cat_64x64_s0", "F8_E4M3", 129},
    {"sdxl_tiny_fp8.safetensors", "sdxl_fp8_cat_64x64_s0", "F8_E4M3", 263},
    {"sd15_tiny_q8_0.gguf", "sd15_q8_0_cat_64x64_s0", "Q8_0", 57},
    {"sdxl_tiny_q4_0.gguf", "sdxl_q4_0_cat_64x64_s0", "Q4_0", 179},
    {"sdxl_tiny_unet_q4_k.gguf", "sdxl_unet_q4_k_cat_64x64_s0", nullptr, 0},
    {"sd15_tiny_unet_q8_0.gguf", "sd15_unet_q8_0_cat_64x64_s0", "Q8_0", 20},
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.file;
}

class SdQuantizedUnet : public ::testing::TestWithParam<Case> {};

TEST_P(SdQuantizedUnet, GivesDiffusersImageOnTheSameValues) {
  const Case& c = GetParam();
  const GoldenFile g("sd_quantized", c.golden);
  ASSERT_EQ(g.meta("file"), c.file);
  const std::string path = quantized_file(c.file);
  const auto pipe = DiffusionPipeline::from_pretrained(
      path, {.single_file_config = testing::data_path("models/" + g.meta("model"))});
  EXPECT_STREQ(pipe->class_name(), g.meta("pipeline").c_str());

  const LinearCounts counts = count_linears(unet_of(*pipe));
  std::printf("[ weights  ] %s: %lld of %lld Linear weights kept quantized\n", c.file,
              static_cast<long long>(counts.quantized), static_cast<long long>(counts.linear));
  EXPECT_EQ(counts.quantized, c.quantized) << c.file;
  if (c.type != nullptr) {
    EXPECT_EQ(counts.types, (std::map<std::string, int64_t>{{c.type, c.quantized}})) << c.file;
    // Kept quantized, the UNet's parameters take less memory than its float32 copy would.
    auto& unet = const_cast<models::UNet2DConditionModel&>(unet_of(*pipe));
    EXPECT_LT(unet.parameter_bytes(float32), static_cast<size_t>(unet.num_parameters()) * 4) << c.file;
  }

  const PipelineOutput out = (*pipe)(g.text_request());
  const double mean = testing::mean_level_difference(out.images[0].pixels, g["image_u8"].select(0, 0));
  std::printf("[ levels   ] %s: mean %.3f vs diffusers\n", c.file, mean);
  testing::expect_images_match(out, g);
  EXPECT_EQ(out.images[0].metadata.at("model"), path);
}

INSTANTIATE_TEST_SUITE_P(Files, SdQuantizedUnet, ::testing::ValuesIn(kCases), [](const auto& info) {
  std::string name = info.param.golden;
  return name.substr(0, name.find("_cat"));
});

std::string copy_of(const std::string& from, const std::string& name, size_t bytes = 0) {
  std::ifstream in(from, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes != 0) data.resize(bytes);
  const std::string path = testing::temp_dir("sd_quantized_" + name) + "/" + name;
  std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  return path;
}

// The error loading `path` as a model on `config` gives (empty when it loads).
std::string load_error(const std::string& path, const std::string& config) {
  try {
    DiffusionPipeline::from_pretrained(path, {.single_file_config = testing::data_path("models/" + config)});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SdQuantizedFiles, BadFilesAreRefusedNamingWhatIsWrong) {
  const std::string file = quantized_file("sd15_tiny_q8_0.gguf");
  // Cut inside the tensor data: the reader checks every tensor lies inside the file before anything runs.
  const std::string cut = copy_of(file, "cut.gguf", std::filesystem::file_size(file) - 1000);
  std::string error = load_error(cut, "sd15-tiny");
  EXPECT_NE(error.find("cut.gguf"), std::string::npos) << error;
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;

  // Another family's GGUF (a FLUX.1 transformer) given as an SD model.
  error = load_error(testing::data_path("gguf/flux-tiny-dev-Q8_0.gguf"), "sd15-tiny");
  EXPECT_NE(error.find("not a whole pipeline in one file"), std::string::npos) << error;
  EXPECT_KILN_ERROR(
      models::open_stable_diffusion_single_file(testing::data_path("gguf/flux-tiny-dev-Q8_0.gguf")),
      "neither SD1.x, SD2.x nor SDXL", "double_blocks (");

  // A quant type Kiln does not read (IQ4_NL, id 20) in one tensor's info: the error names the tensor.
  std::ifstream in(file, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string tensor = "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight";
  const size_t at = data.find(tensor);
  ASSERT_NE(at, std::string::npos);
  // name, then n_dims (uint32, 2 here), the dims (uint64 each), the type id (uint32).
  ASSERT_EQ(data[at + tensor.size()], 2);
  data[at + tensor.size() + 4 + 16] = 20;
  const std::string iq = testing::temp_dir("sd_quantized_iq") + "/iq4_nl.gguf";
  std::ofstream(iq, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  error = load_error(iq, "sd15-tiny");
  EXPECT_NE(error.find("iq4_nl.gguf: tensor '" + tensor + "'"), std::string::npos) << error;
  EXPECT_NE(error.find("unsupported ggml type id 20"), std::string::npos) << error;
}

}  // namespace
}  // namespace kiln
