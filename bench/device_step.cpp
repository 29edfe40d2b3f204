// One transformer step on a device, strict eager and compiled, for scripts/device_check.sh's table against
// PyTorch (bench/torch_step.py builds plain torch modules of the same shapes):
//   flux  FLUX.1-shaped transformer (bench_util.h: width 3072 = 24 heads x 128, 1 double + 1 single block),
//         bf16, size x size pixels ((size/16)^2 image tokens) and 512 text tokens, batch 1;
//   sd3   SD3.5-Medium-shaped (width 1536 = 24 heads x 64, 2 joint blocks, block 0 with the second
//   attention),
//         bf16, size x size pixels ((size/16)^2 image tokens), 333 text tokens, CFG batch 2.
// Random weights, built on the host and moved (pipe.to's route). Prints one line per figure:
//   RESULT kiln <model> <eager|compiled> <best ms over reps> first=<ms of the first call, compiling included>
//   MEMORY kiln <model> <eager|compiled> activations=<the most Kiln held on the device during the timed
//   calls,
//          above what it held before them> estimate=<the step's share of a memory budget's activation
//          estimate, kiln/pipelines/activation_estimate.h>
//   CROSS kiln <model> <eager|compiled> target=<T> programs=<n> largest_run=<bytes> most_scratch=<bytes>
//         estimate=<bytes>   with KILN_PJRT_CROSS_COMPILE=T,...: what target T's own compiler says the mode's
//         programs need on its device (cross_compile.h), beside the estimate for that device type
// Usage: bench_device_step <flux|sd3> [device=cuda] [reps=5] [size=1024]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "bench_util.h"
#include "kiln/core/device_runtime.h"
#include "kiln/kiln.h"
#include "kiln/pipelines/activation_estimate.h"
#include "kiln/runtime/cross_compile.h"

namespace {

// Ops return once queued on the device's stream: reading one element of the output back waits for them all,
// so the kernels are timed.
double seconds(kiln::Device device, const std::function<kiln::Tensor()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  const kiln::Tensor out = f();
  (void)out.flatten().narrow(0, 0, 1).to(kiln::float32).to(kiln::cpu).to_vector<float>();
  kiln::synchronize(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The first call (compiles, for either mode: strict eager compiles one executable per distinct op call), then
// the best of `reps`.
// With KILN_PJRT_CROSS_COMPILE set, what each target's compiler says one mode's programs need there: the
// largest program's arguments + outputs + scratch, the most scratch, beside the estimate for that target's
// device type (cuDNN's fused attention on cuda keeps no scores).
void print_cross_compiled(const std::string& model, const char* mode,
                          const std::function<int64_t(kiln::Device)>& estimate_for) {
  for (const kiln::CrossCompileSummary& s : kiln::cross_compile_summary()) {
    const kiln::Device target(s.target.substr(0, s.target.find(':')));
    std::printf("CROSS kiln %s %s target=%s programs=%lld largest_run=%lld most_scratch=%lld estimate=%lld\n",
                model.c_str(), mode, s.target.c_str(), static_cast<long long>(s.programs),
                static_cast<long long>(s.largest_program_bytes),
                static_cast<long long>(s.largest_scratch_bytes),
                static_cast<long long>(estimate_for(target)));
  }
  kiln::reset_cross_compile_summary();
}

void time_modes(const std::string& model, kiln::Device device, kiln::nn::Module& module, int reps,
                const std::function<kiln::Tensor()>& step,
                const std::function<int64_t(kiln::Device)>& estimate_for) {
  const int64_t estimate = estimate_for(device);
  for (const bool compiled : {false, true}) {
    module.reset_compiled();
    kiln::reset_cross_compile_summary();
    if (compiled) module.compile({.fullgraph = true, .dynamic = false});
    const double first = seconds(device, step);
    const int64_t held = kiln::memory_stats(device).current_bytes;
    kiln::reset_peak_memory(device);
    double best = 1e30;
    for (int i = 0; i < reps; ++i) best = std::min(best, seconds(device, step));
    const char* mode = compiled ? "compiled" : "eager";
    std::printf("RESULT kiln %s %s %.3f first=%.1f\n", model.c_str(), mode, best * 1e3, first * 1e3);
    std::printf("MEMORY kiln %s %s activations=%lld estimate=%lld\n", model.c_str(), mode,
                static_cast<long long>(kiln::memory_stats(device).peak_bytes - held),
                static_cast<long long>(estimate));
    print_cross_compiled(model, mode, estimate_for);
    std::fflush(stdout);
  }
  module.reset_compiled();
}

int run(int argc, char** argv) {
  using kiln::bfloat16;
  if (argc < 2 || (std::string(argv[1]) != "flux" && std::string(argv[1]) != "sd3")) {
    std::fprintf(stderr, "usage: bench_device_step <flux|sd3> [device=cuda] [reps=5] [size=1024]\n");
    return 2;
  }
  const std::string model = argv[1];
  const kiln::Device device(argc > 2 ? argv[2] : "cuda");
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  const int64_t size = argc > 4 ? std::atoll(argv[4]) : 1024;
  if (reps < 1 || reps > 1000 || size < 16 || size > 4096 || size % 16 != 0) {
    std::fprintf(stderr, "bench_device_step: reps must be 1..1000 and size a multiple of 16 in 16..4096\n");
    return 2;
  }
  // Reach the device before building the random weights (half a minute for the FLUX shape on a CPU), so that
  // a device that is not there is reported at once.
  kiln::device_runtime(device);
  if (model == "flux") {
    kiln::bench::FluxShapedStep s = kiln::bench::flux_shaped_step(size);
    s.model->to(device);
    for (kiln::Tensor* t : {&s.hidden, &s.text, &s.pooled, &s.timestep, &s.guidance, &s.txt_ids, &s.img_ids})
      *t = t->to(device);
    const auto estimate = [&](kiln::Device on) {
      return kiln::block_stack_activation_bytes(
          {.tokens = (size / 16) * (size / 16) + 512,
           .width = 3072,
           .mlp_width = 4 * 3072,
           .heads = 24,
           .fused_attention = kiln::fuses_attention(on, bfloat16, 128),
           .attention_key_block = kiln::attention_key_block(on, bfloat16, 128)},
          bfloat16);
    };
    time_modes(
        model, device, *s.model, reps, [&] { return s.forward(); }, estimate);
    return 0;
  }
  const kiln::models::SD3TransformerConfig config = kiln::bench::sd3_medium_shaped_config();
  kiln::models::SD3Transformer2DModel sd3(config);
  kiln::nn::LoadOptions options;
  options.dtype = bfloat16;
  sd3.load_weights(kiln::bench::RandomWeights(sd3, bfloat16), options);
  sd3.to(device);
  const int64_t B = 2, L = 333, h = size / 8;
  kiln::Generator gen(0);
  const kiln::Tensor latents =
      kiln::bench::random({B, config.in_channels, h, h}, bfloat16, gen, 1.0).to(device);
  const kiln::Tensor text =
      kiln::bench::random({B, L, config.joint_attention_dim}, bfloat16, gen, 1.0).to(device);
  const kiln::Tensor pooled =
      kiln::bench::random({B, config.pooled_projection_dim}, bfloat16, gen, 1.0).to(device);
  const kiln::Tensor t = kiln::Tensor::full({B}, 500.0, kiln::float32).to(device);
  const auto estimate = [&](kiln::Device on) {
    return kiln::block_stack_activation_bytes(
        {.batch = B,
         .tokens = (size / 16) * (size / 16) + L,
         .width = config.inner_dim(),
         .mlp_width = 4 * config.inner_dim(),
         .heads = config.num_attention_heads,
         .fused_attention = kiln::fuses_attention(on, bfloat16, config.attention_head_dim),
         .attention_key_block = kiln::attention_key_block(on, bfloat16, config.attention_head_dim)},
        bfloat16);
  };
  time_modes(
      model, device, sd3, reps, [&] { return sd3.forward(latents, text, pooled, t); }, estimate);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_device_step: error: %s\n", e.what());
    return 1;
  }
}
