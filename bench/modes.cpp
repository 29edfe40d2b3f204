// The execution modes side by side, in one run: strict eager, deferred-and-fused, compiled (whole forward)
// and compiled repeated blocks, on
//   1. the tiny FLUX test transformer (tests/data/models/flux-tiny-schnell, f32, 64x64);
//   2. a FLUX.1-shaped transformer (real widths, 1 double + 1 single block, random bf16 weights, 512 text
//      tokens) at 256^2 and 512^2.
// For each: the first call (with the JIT building its kernels into a fresh cache, and the trace/plan for
// compiled modes), the steady time per transformer step, the kernels launched and the bytes their operands
// take per step (kiln::counters), and the step's peak memory above what was held before it.
// Usage: bench_modes [repetitions=3] [sizes=256,512] [data_dir=tests/data]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kiln/kiln.h"
#include "kiln/models/flux_transformer.h"

namespace {

using kiln::bench::random;

enum class Mode { Eager, Fuse, Compile, CompileBlocks };
const Mode kModes[] = {Mode::Eager, Mode::Fuse, Mode::Compile, Mode::CompileBlocks};
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Eager:
      return "eager";
    case Mode::Fuse:
      return "fuse";
    case Mode::Compile:
      return "compile";
    case Mode::CompileBlocks:
      return "compile-blocks";
  }
  return "?";
}

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  kiln::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `step` in each mode on `model` and prints one row per mode.
void compare_modes(const char* title, kiln::models::FluxTransformer2DModel& model, int reps,
                   const std::function<void()>& step) {
  std::printf("%s\n", title);
  std::printf("  %-15s %12s %12s %9s %12s %12s %10s\n", "mode", "first call", "step", "vs eager",
              "kernels/step", "MB moved", "peak MB");
  double eager_step = 0;
  for (Mode mode : kModes) {
    model.reset_compiled();
    if (mode == Mode::Compile) model.compile({.fullgraph = true, .dynamic = false});
    if (mode == Mode::CompileBlocks) model.compile_repeated_blocks();
    kiln::EagerModeGuard guard(mode == Mode::Fuse ? kiln::EagerMode::DeferAndFuse
                                                  : kiln::EagerMode::DeferNever);
    const double first = seconds_of(step);
    double best = 1e30;
    for (int i = 0; i < reps; ++i) best = std::min(best, seconds_of(step));
    const int64_t held = kiln::memory_stats(kiln::cpu).current_bytes;
    kiln::reset_counters();
    step();
    kiln::synchronize();
    const kiln::Counters c = kiln::counters();
    if (mode == Mode::Eager) eager_step = best;
    std::printf("  %-15s %10.1f ms %10.1f ms %8.2fx %12lld %12.1f %10.1f\n", mode_name(mode), first * 1e3,
                best * 1e3, eager_step / best, static_cast<long long>(c.kernels_launched),
                c.bytes_moved / 1e6, (c.memory_of(kiln::cpu).peak_bytes - held) / 1e6);
  }
  model.reset_compiled();
  std::printf("\n");
}

void tiny(const std::string& data, int reps) {
  auto model =
      kiln::models::load_flux_transformer(data + "/models/flux-tiny-schnell/transformer", kiln::float32);
  kiln::Generator gen(0);
  const kiln::Tensor hidden = random({1, 16, 64}, kiln::float32, gen, 1.0);
  const kiln::Tensor text = random({1, 32, 32}, kiln::float32, gen, 1.0);
  const kiln::Tensor pooled = random({1, 32}, kiln::float32, gen, 1.0);
  const kiln::Tensor t = kiln::Tensor::full({1}, 0.5, kiln::float32);
  const kiln::Tensor txt_ids = kiln::models::flux_text_ids(32, kiln::float32);
  const kiln::Tensor img_ids = kiln::models::flux_latent_image_ids(4, 4, kiln::float32);
  kiln::Tensor out;  // held until the step is synchronised: an unread result would be dead code
  compare_modes("tiny FLUX transformer (2+2 blocks, width 32), f32, 64x64, 32 text tokens:", *model, reps,
                [&] { out = model->forward(hidden, text, pooled, t, {}, txt_ids, img_ids); });
}

void flux_shaped(int size, int reps) {
  const kiln::bench::FluxShapedStep flux = kiln::bench::flux_shaped_step(size);
  const int64_t n = flux.image_tokens, l = flux.text.size(1);
  char title[160];
  std::snprintf(
      title, sizeof title,
      "FLUX.1-shaped transformer (1 double + 1 single block, width 3072), bf16, %dx%d (%lld image + "
      "%lld text tokens):",
      size, size, static_cast<long long>(n), static_cast<long long>(l));
  kiln::Tensor out;  // held until the step is synchronised: an unread result would be dead code
  compare_modes(title, *flux.model, reps, [&] { out = flux.forward(); });
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 3;
  std::vector<int> sizes;
  std::stringstream list(argc > 2 ? argv[2] : "256,512");
  for (std::string s; std::getline(list, s, ',');) sizes.push_back(std::stoi(s));
  const std::string data = argc > 3 ? argv[3] : "tests/data";
  // A fresh kernel cache, so that "first call" includes building every fused kernel.
  const std::string cache = (std::filesystem::temp_directory_path() / "kiln-bench-modes-cache").string();
  std::filesystem::remove_all(cache);
  setenv("KILN_CACHE_DIR", cache.c_str(), 1);
  tiny(data, reps);
  for (int size : sizes) flux_shaped(size, reps);
  return 0;
}
