// VAE decode time and peak memory with the real FLUX.1 VAE configuration (block_out_channels 128/256/512/512,
// two resnets per block, 16 latent channels; read from tests/data/goldens/flux/real_layouts.json) and random
// weights made here: untiled and tiled (diffusers' enable_vae_tiling with 512-pixel tiles: FLUX's own
// sample_size of 1024 would not tile a 1024x1024 image), in bfloat16 and float32.
//
// Peak memory is reported two ways: Kiln's allocator high-water mark (tensors, including oneDNN's layout
// copies, which Kiln allocates) and the process's VmHWM (resident high-water mark: adds weights' file
// pages, oneDNN's scratchpads, the allocator's slack and the runtime itself). VmHWM is reset between cases
// through /proc/self/clear_refs.
// Usage: bench_vae_decode [size=1024] [case=all|bf16|bf16-whole|bf16-tiled|f32|f32-whole|f32-tiled]
//                         [data_dir=tests/data]
// (one case per process gives each its own clean VmHWM).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "bench_util.h"
#include "kiln/io/json_config.h"
#include "kiln/kiln.h"
#include "kiln/models/autoencoder_kl.h"

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

int64_t vm_hwm_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

void reset_vm_hwm() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

std::string flux_vae_config(const std::string& data) {
  const auto layouts = kiln::io::JsonConfig::load(data + "/goldens/flux/real_layouts.json");
  const std::string path = "/tmp/kiln_bench_flux_vae_config.json";
  std::ofstream(path) << layouts.object("configs").dump("vae");
  return path;
}

void run_case(const std::string& config_path, kiln::DType dtype, bool tiled, bool banded, int64_t size) {
  using kiln::memory_stats;
  const auto config = kiln::models::AutoencoderKLConfig::from_file(config_path);
  kiln::models::AutoencoderKL vae(config);
  kiln::nn::LoadOptions options;
  options.dtype = dtype;
  vae.load_weights(kiln::bench::RandomWeights(vae, dtype), options);
  if (tiled) vae.enable_tiling({.tile_sample_min_size = 512});
  if (!banded) vae.set_conv_band_bytes(0);
  kiln::Generator gen(0);
  const int64_t f = config.scale_factor();
  const kiln::Tensor z = kiln::randn({1, config.latent_channels, size / f, size / f}, dtype, gen);
  kiln::synchronize();
  const int64_t resident_before = memory_stats().current_bytes;
  kiln::reset_peak_memory();
  reset_vm_hwm();
  const int64_t hwm_before = vm_hwm_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  const kiln::Tensor image = vae.decode(z);
  kiln::synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t peak = memory_stats().peak_bytes;
  const int64_t hwm = vm_hwm_bytes();
  std::printf(
      "%-9s %-11s %5ldx%-5ld %8.2f s   kiln peak %7.0f MiB (%6.0f MiB above weights+latent)   VmHWM %7.0f "
      "MiB "
      "(%6.0f before)\n",
      std::string(kiln::dtype_name(dtype)).c_str(),
      tiled ? (banded ? "tiled" : "tiled-whole") : (banded ? "untiled" : "whole"),
      static_cast<long>(image.size(2)), static_cast<long>(image.size(3)), seconds, peak / kMiB,
      (peak - resident_before) / kMiB, hwm / kMiB, hwm_before / kMiB);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t size = argc > 1 ? std::stoll(argv[1]) : 1024;
  const std::string cases = argc > 2 ? argv[2] : "all";
  const std::string data = argc > 3 ? argv[3] : "tests/data";
  const std::string config = flux_vae_config(data);
  std::printf("FLUX.1 VAE decode (real config, random weights), %ldx%ld, tiles of 512 pixels when tiled\n",
              static_cast<long>(size), static_cast<long>(size));
  // "-whole": every convolution over the whole image at once (AutoencoderKL::set_conv_band_bytes(0)), the
  // memory before banding.
  for (const char* name : {"bf16", "bf16-whole", "bf16-tiled", "f32", "f32-whole", "f32-tiled"}) {
    const std::string c = name;
    if (cases != "all" && cases != c) continue;
    run_case(config, c.rfind("bf16", 0) == 0 ? kiln::bfloat16 : kiln::float32,
             c.find("tiled") != std::string::npos, c.find("whole") == std::string::npos, size);
  }
  return 0;
}
