// kiln::scaled_dot_product_attention on the FLUX.1 attention shapes: batch 1, 24 heads x 128, S = 4608
// (1024x1024 image + 512 text tokens) and S = 1536 (512x512), with q, k, v as heads split out of
// [B, S, H, D] projections (the layout models produce). FLOPs = 4 B H S^2 D (the two products).
// Prints time (best and median of the repetitions) and GFLOP/s, each as a fraction of this host's ceiling
// measured in the same run on every thread (bf16_ceiling.h: f32 FMA, vdpbf16ps, AMX; the fastest for bf16,
// f32 FMA's for float32), and which path bf16 products take (matmul_path.h). No fixed peak: the hosts
// differ by 5x and more (two Zen 5 VMs alone measured 790-800 and 1,040-1,140 GFLOP/s of vdpbf16ps on 2
// cores).
// The host is shared: besides wall-clock figures it prints the process CPU time per thread, which is what
// the kernel would take on otherwise idle cores (CPU-time GFLOP/s = FLOPs / (CPU seconds / threads)).
// Other tenants of the host also slow the cores themselves (a register-only VDPBF16PS loop has been seen
// at 234 instead of 410 GFLOP/s per core), which the ceiling of the moment takes into account.
// Usage: bench_attention [repetitions=3] [bf16|f32|all=all] [S[:HxD] ...=4608 1536]
// (H x D defaults to FLUX's 24 x 128; SD3.5-Medium at 1024x1024 with guidance is 4429:48x64, its batch of 2
// folded into the heads.)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include "backends/cpu/cpu_features.h"
#include "bench_util.h"
#include "bf16_ceiling.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/attention.h"
#include "kiln/runtime/execution_context.h"

namespace {

using Clock = std::chrono::steady_clock;

// [B, S, H, D] filled with uniform noise, returned as the [B, H, S, D] head-split view.
kiln::Tensor heads_view(int64_t s, int64_t h, int64_t d, kiln::DType dtype, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(s * h * d));
  for (float& x : v) x = dist(gen);
  return kiln::Tensor::from_vector(v, {1, s, h, d}).to(dtype).permute({0, 2, 1, 3});
}

struct Shape {
  int64_t s, heads = 24, d = 128;
};

// "S" or "S:HxD".
Shape parse_shape(const std::string& text) {
  Shape shape;
  long long s = 0, h = 0, d = 0;
  if (std::sscanf(text.c_str(), "%lld:%lldx%lld", &s, &h, &d) == 3) {
    shape = {s, h, d};
  } else {
    shape.s = std::atoll(text.c_str());
  }
  if (shape.s <= 0 || shape.heads <= 0 || shape.d <= 0) {
    std::fprintf(stderr, "bench_attention: expected S or S:HxD with positive numbers, got '%s'\n",
                 text.c_str());
    std::exit(2);
  }
  return shape;
}

void run(const Shape& shape, kiln::DType dtype, int repetitions) {
  const int64_t s = shape.s, heads = shape.heads, d = shape.d;
  const kiln::Tensor q = heads_view(s, heads, d, dtype, 1);
  const kiln::Tensor k = heads_view(s, heads, d, dtype, 2);
  const kiln::Tensor v = heads_view(s, heads, d, dtype, 3);
  const double flops = 4.0 * heads * static_cast<double>(s) * static_cast<double>(s) * d;

  kiln::scaled_dot_product_attention(q, k, v);  // warm-up: page faults of the buffers, thread start
  kiln::synchronize();
  std::vector<double> times, cpu_times;
  const int threads = omp_get_max_threads();
  for (int r = 0; r < repetitions; ++r) {
    const auto t0 = Clock::now();
    const double c0 = kiln::bench::process_cpu_seconds();
    const kiln::Tensor out = kiln::scaled_dot_product_attention(q, k, v);
    kiln::synchronize();  // ops return once queued; wait for the kernel
    cpu_times.push_back((kiln::bench::process_cpu_seconds() - c0) / threads);
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  // bf16 against the fastest instruction a bf16 product can use; float32 against f32 FMA.
  const kiln::bench::Bf16Ceiling measured = kiln::bench::measure_bf16_ceiling();
  kiln::bench::print_ceiling(measured);
  const double ceiling = (dtype == kiln::bfloat16 ? measured.gflops : measured.rates.fma32) * 1e9;
  std::sort(times.begin(), times.end());
  std::sort(cpu_times.begin(), cpu_times.end());
  const double best = times.front(), median = times[times.size() / 2], cpu = cpu_times.front();
  std::printf(
      "%-8s S=%-5lld H=%lld D=%lld thr=%d  wall best %7.1f ms median %7.1f ms: %6.1f GFLOP/s = %5.1f%% "
      "of the measured ceiling %.0f (median %5.1f%%) | CPU time/thread %7.1f ms: %6.1f GFLOP/s = %5.1f%%\n",
      std::string(kiln::dtype_name(dtype)).c_str(), static_cast<long long>(s), static_cast<long long>(heads),
      static_cast<long long>(d), threads, best * 1e3, median * 1e3, flops / best * 1e-9,
      100.0 * flops / best / ceiling, ceiling * 1e-9, 100.0 * flops / median / ceiling, cpu * 1e3,
      flops / cpu * 1e-9, 100.0 * flops / cpu / ceiling);
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const std::string which = argc > 2 ? argv[2] : "all";
  std::vector<Shape> shapes;
  for (int i = 3; i < argc; ++i) shapes.push_back(parse_shape(argv[i]));
  if (shapes.empty()) shapes = {Shape{4608}, Shape{1536}};
  std::printf("kernel variant: %s\n", kiln::cpu_kernels::cpu_isa_name());
  for (const Shape& shape : shapes) {
    if (which == "all" || which == "bf16") run(shape, kiln::bfloat16, repetitions);
    if (which == "all" || which == "f32") run(shape, kiln::float32, repetitions);
  }
  return 0;
}
