// Softmax, the norms, rope and a row sum on the DiT shapes that dominate their cost: 4096 rows of 3072
// (hidden states) and 4096 x 24 rows of 128 (per-head q/k), in float32 and bfloat16. These ops are
// bandwidth-bound, so the figure of merit is the effective bandwidth: bytes read once plus bytes written once
// per call, divided by the time, compared with the ~50 GB/s two cores get from DRAM on this machine
// (shared/reference/cpu-limits.md; 30 GB/s for one core). Prints best and median wall time of the
// repetitions. Usage: bench_reduction [repetitions=10]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "kiln/core/device_runtime.h"
#include "kiln/ops/layout.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduction.h"
#include "kiln/runtime/execution_context.h"

namespace {

using Clock = std::chrono::steady_clock;
using kiln::Tensor;

Tensor noise(const kiln::Shape& shape, kiln::DType dtype, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(kiln::shape_numel(shape)));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(v, shape).to(dtype);
}

void measure(const std::string& name, double bytes, int repetitions, const std::function<Tensor()>& fn) {
  fn();  // warm-up: first-touch page faults of the output, thread start
  kiln::synchronize();
  std::vector<double> times;
  for (int r = 0; r < repetitions; ++r) {
    const auto t0 = Clock::now();
    Tensor out = fn();
    kiln::synchronize();  // ops return once queued; time the kernel
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  const double best = times.front(), median = times[times.size() / 2];
  std::printf("%-44s best %8.3f ms  median %8.3f ms  %6.1f GB/s (%3.0f%% of 50 GB/s)\n", name.c_str(),
              best * 1e3, median * 1e3, bytes / best / 1e9, 100.0 * bytes / best / 50e9);
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 10;
  std::printf("kernels: %s, threads: %d\n", kiln::cpu_kernels::cpu_isa_name(), omp_get_max_threads());
  for (kiln::DType dt : {kiln::float32, kiln::bfloat16}) {
    const std::string tag = std::string(kiln::dtype_name(dt));
    const double es = static_cast<double>(kiln::dtype_size(dt));
    const Tensor hidden = noise({1, 4096, 3072}, dt, 1);
    const double h_bytes = 2.0 * static_cast<double>(hidden.numel()) * es;
    const Tensor w = noise({3072}, dt, 2);
    measure("layer_norm [4096, 3072] no affine " + tag, h_bytes, repetitions,
            [&] { return kiln::layer_norm(hidden, 1, Tensor(), Tensor(), 1e-6); });
    measure("rms_norm [4096, 3072] " + tag, h_bytes, repetitions,
            [&] { return kiln::rms_norm(hidden, w, 1e-6); });
    measure("softmax [4096, 3072] " + tag, h_bytes, repetitions, [&] { return kiln::softmax(hidden, -1); });
    measure("sum dim -1 [4096, 3072] " + tag, h_bytes / 2, repetitions,
            [&] { return kiln::sum(hidden, {-1}); });
    measure("sum dim 1 [4096, 3072] (columns) " + tag, h_bytes / 2, repetitions,
            [&] { return kiln::sum(hidden, {1}); });

    // q as the head-split view of a [1, S, H, D] projection, as attention blocks produce it.
    const Tensor q = noise({1, 4096, 24, 128}, dt, 3).permute({0, 2, 1, 3});
    const double q_bytes = 2.0 * static_cast<double>(q.numel()) * es;
    const Tensor qw = noise({128}, dt, 4);
    const Tensor cos = noise({4096, 128}, kiln::float32, 5), sin = noise({4096, 128}, kiln::float32, 6);
    measure("rms_norm heads [1, 24, 4096, 128] view " + tag, q_bytes, repetitions,
            [&] { return kiln::rms_norm(q, qw, 1e-6); });
    // SD3.5's q/k norm: rows of 64 in place in a [1, S, H, D] projection.
    const Tensor q64 = noise({1, 4096, 24, 64}, dt, 10);
    const Tensor qw64 = noise({64}, dt, 11);
    measure("rms_norm heads [1, 4096, 24, 64] " + tag, 2.0 * static_cast<double>(q64.numel()) * es,
            repetitions, [&] { return kiln::rms_norm(q64, qw64, 1e-6); });
    measure("apply_rope interleaved [1, 24, 4096, 128] " + tag, q_bytes, repetitions,
            [&] { return kiln::apply_rope(q, cos, sin, kiln::RopeStyle::Interleaved); });
    measure("apply_rope rotate_half [1, 24, 4096, 128] " + tag, q_bytes, repetitions,
            [&] { return kiln::apply_rope(q, cos, sin, kiln::RopeStyle::RotateHalf); });

    const Tensor vae = noise({1, 256, 128, 128}, dt, 7);
    const Tensor gw = noise({256}, dt, 8), gb = noise({256}, dt, 9);
    measure("group_norm 32 groups [1, 256, 128, 128] " + tag, 2.0 * static_cast<double>(vae.numel()) * es,
            repetitions, [&] { return kiln::group_norm(vae, 32, gw, gb, 1e-6); });
  }
  return 0;
}
