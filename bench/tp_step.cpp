// Tensor parallelism on this machine: one FLUX.1- or SD3.5-Medium-shaped transformer step (real widths,
// cut-down depth, random bf16 weights) as 1 rank or as N ranks, printing the step time, the weights and peak
// memory each rank holds, and what the collectives cost per step (calls, bytes each rank sends, seconds
// inside MPI).
//   OMP_NUM_THREADS=2 ./build/bench/bench_tp_step flux 512
//   OMP_NUM_THREADS=1 mpirun -np 2 ./build/bench/bench_tp_step flux 512
// Usage: bench_tp_step [flux|sd3] [size=512] [steps=3]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "bench_util.h"
#include "kiln/kiln.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/sd3_transformer.h"

namespace {

using kiln::bfloat16;

// Bytes of the parameter tensors this rank holds.
size_t held_bytes(kiln::nn::Module& model) {
  size_t bytes = 0;
  for (const auto& [name, t] : model.named_parameters())
    if (t->defined()) bytes += t->nbytes();
  return bytes;
}

// Random weights for the sharded model: the unsharded model's shapes, sliced per rank on load.
template <typename Model, typename Config>
std::unique_ptr<Model> random_model(const Config& config, const kiln::nn::TensorParallel& tp) {
  Model shapes(config);  // registering parameters allocates nothing
  auto model = std::make_unique<Model>(config, tp);
  kiln::nn::LoadOptions options;
  options.dtype = bfloat16;
  model->load_weights(kiln::bench::RandomWeights(shapes, bfloat16), options);
  return model;
}

void report(const char* what, kiln::nn::Module& model, int steps, double seconds,
            const kiln::dist::CollectiveStats& before) {
  const kiln::dist::CollectiveStats after = kiln::dist::collective_stats();
  const double step = seconds / steps, comm = (after.seconds - before.seconds) / steps;
  const double mb = 1.0 / (1 << 20);
  // Every rank prints its own line: memory and communication time differ between ranks.
  std::printf(
      "%s, rank %d of %d, OMP_NUM_THREADS=%s: step %.1f ms; weights held %.1f MiB; peak memory %.1f MiB; "
      "per step %lld collectives, %.2f MiB sent, %.1f ms in MPI (%.0f%% of the step)\n",
      what, kiln::dist::rank(), kiln::dist::world_size(),
      std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "(default)", step * 1e3,
      held_bytes(model) * mb, kiln::memory_stats().peak_bytes * mb,
      static_cast<long long>((after.calls - before.calls) / steps),
      (after.bytes_sent - before.bytes_sent) / steps * mb, comm * 1e3, 100.0 * comm / step);
  std::fflush(stdout);
}

// Wall time of `steps` calls after the caller's warm-up (so the collective counts cover exactly these).
template <typename Forward>
double time_steps(int steps, const Forward& forward) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) forward();
  kiln::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void flux(int64_t size, int steps, const kiln::nn::TensorParallel& tp) {
  kiln::models::FluxTransformerConfig config;
  config.num_layers = 1;
  config.num_single_layers = 1;
  config.guidance_embeds = true;
  auto model = random_model<kiln::models::FluxTransformer2DModel>(config, tp);
  const int64_t grid = size / 16, text_tokens = 512;
  kiln::Generator gen(0);  // same inputs on every rank
  const kiln::Tensor hidden = kiln::bench::random({1, grid * grid, config.in_channels}, bfloat16, gen, 1.0);
  const kiln::Tensor text =
      kiln::bench::random({1, text_tokens, config.joint_attention_dim}, bfloat16, gen, 1.0);
  const kiln::Tensor pooled = kiln::bench::random({1, config.pooled_projection_dim}, bfloat16, gen, 1.0);
  const kiln::Tensor t = kiln::Tensor::full({1}, 0.5, bfloat16),
                     g = kiln::Tensor::full({1}, 3.5, kiln::float32);
  const kiln::Tensor txt_ids = kiln::models::flux_text_ids(text_tokens, bfloat16);
  const kiln::Tensor img_ids = kiln::models::flux_latent_image_ids(grid, grid, bfloat16);
  auto forward = [&] { model->forward(hidden, text, pooled, t, g, txt_ids, img_ids); };
  forward();  // first call: packing and allocation
  kiln::synchronize();
  const kiln::dist::CollectiveStats before = kiln::dist::collective_stats();
  const double seconds = time_steps(steps, forward);
  const std::string what = "FLUX.1-shaped (1+1 blocks, width 3072), " + std::to_string(size) + "^2, bf16";
  report(what.c_str(), *model, steps, seconds, before);
}

void sd3(int64_t size, int steps, const kiln::nn::TensorParallel& tp) {
  const kiln::models::SD3TransformerConfig config = kiln::bench::sd3_medium_shaped_config();
  auto model = random_model<kiln::models::SD3Transformer2DModel>(config, tp);
  const int64_t B = 2, L = 333, h = size / 8;
  kiln::Generator gen(0);
  const kiln::Tensor latents = kiln::bench::random({B, config.in_channels, h, h}, bfloat16, gen, 1.0);
  const kiln::Tensor text = kiln::bench::random({B, L, config.joint_attention_dim}, bfloat16, gen, 1.0);
  const kiln::Tensor pooled = kiln::bench::random({B, config.pooled_projection_dim}, bfloat16, gen, 1.0);
  const kiln::Tensor t = kiln::Tensor::full({B}, 500.0, kiln::float32);
  auto forward = [&] { model->forward(latents, text, pooled, t); };
  forward();  // first call: packing and allocation
  kiln::synchronize();
  const kiln::dist::CollectiveStats before = kiln::dist::collective_stats();
  const double seconds = time_steps(steps, forward);
  const std::string what =
      "SD3.5-Medium-shaped (2 blocks, width 1536, CFG batch 2), " + std::to_string(size) + "^2, bf16";
  report(what.c_str(), *model, steps, seconds, before);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "flux";
  const int64_t size = argc > 2 ? std::atoll(argv[2]) : 512;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 3;
  try {
    if (kiln::dist::launched_by_mpirun()) kiln::dist::init_process_group({.backend = "mpi"});
    const int n = kiln::dist::world_size();
    const kiln::nn::TensorParallel tp =
        n > 1 ? kiln::dist::TensorParallelConfig{.mesh = kiln::dist::DeviceMesh("cpu", {n})}.layers()
              : kiln::nn::TensorParallel{};
    if (model == "flux")
      flux(size, steps, tp);
    else if (model == "sd3")
      sd3(size, steps, tp);
    else
      KILN_FAIL("bench_tp_step: expected flux or sd3, got '" << model << "'");
  } catch (const std::exception& e) {
    if (kiln::dist::world_size() > 1) kiln::dist::abort_group(e.what());
    std::fprintf(stderr, "bench_tp_step: %s\n", e.what());
    return 1;
  }
  kiln::dist::destroy_process_group();
  return 0;
}
