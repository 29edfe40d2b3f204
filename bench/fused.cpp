// The fused ops (kiln/ops/fused.h) against the chains of ops they replace, on FLUX.1 shapes at 1024x1024
// (4096 image + 512 text tokens = 4608 rows, hidden size 3072), side by side:
//  * mlp_up:   x [1, 4608, 3072] @ w^T [3072 -> 12288] + bias, gelu_tanh          (the MLP's first linear)
//  * proj_out: x [1, 4608, 15360] @ w^T [15360 -> 3072] + bias, * gate [1, 1, 3072] + residual
//              (the single-stream block's output projection with its gated residual)
//  * norm_modulate: layer_norm / rms_norm of x [1, 4608, 3072] * (1 + scale) + shift, scale/shift [1, 1,
//  3072]
// Each case times the fused op, the unfused chain, and (linears) the bare linear, interleaved repetition by
// repetition so that load from other tenants of the host hits all alike; prints best and median ms, GFLOP/s
// for the linears and unfused / fused.
// Usage: bench_fused [repetitions=3] [bf16|f32]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/runtime/execution_context.h"

namespace {

using kiln::Tensor;

// One call of a variant: its output is kept until the kernels have run.
kiln::bench::Timing time_of(const std::function<Tensor()>& f) {
  return kiln::bench::time_of([&] {
    const Tensor out = f();
    kiln::synchronize();
  });
}

struct Variant {
  std::string name;
  std::function<Tensor()> run;
  std::vector<double> wall, cpu;
};

// Warms every variant up once (primitive creation, weight packing), then runs them interleaved.
void compare(const std::string& title, double flops, std::vector<Variant> variants, int reps) {
  for (Variant& v : variants) time_of(v.run);
  for (int r = 0; r < reps; ++r)
    for (Variant& v : variants) {
      const kiln::bench::Timing t = time_of(v.run);
      v.wall.push_back(t.wall);
      v.cpu.push_back(t.cpu);
    }
  std::printf("%s\n", title.c_str());
  for (Variant& v : variants) {
    std::sort(v.wall.begin(), v.wall.end());
    std::sort(v.cpu.begin(), v.cpu.end());
  }
  // variants[0] is the fused op; a variant named "linear" is the bare product, so that the time each
  // epilogue adds on top of it is shown.
  const Variant& fused = variants.front();
  const Variant* bare = nullptr;
  for (const Variant& v : variants)
    if (v.name == "linear") bare = &v;
  for (const Variant& v : variants) {
    const double best = v.wall.front(), median = v.wall[v.wall.size() / 2], cpu = v.cpu.front();
    std::printf("  %-8s wall best %8.2f ms  median %8.2f ms  cpu best %8.2f ms", v.name.c_str(), best * 1e3,
                median * 1e3, cpu * 1e3);
    if (flops > 0) std::printf("  %4.0f GFLOP/s", flops / best * 1e-9);
    if (bare != nullptr && &v != bare)
      std::printf("  epilogue +%.1f ms wall, +%.1f ms cpu", (best - bare->wall.front()) * 1e3,
                  (cpu - bare->cpu.front()) * 1e3);
    if (&v != &fused)
      std::printf("  %s/fused: wall %.2fx cpu %.2fx", v.name.c_str(), best / fused.wall.front(),
                  cpu / fused.cpu.front());
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const std::string type = argc > 2 ? argv[2] : "bf16";
  const kiln::DType dt = type == "f32" ? kiln::float32 : kiln::bfloat16;
  const int64_t rows = 4608, hidden = 3072, mlp = 12288, cat = hidden + mlp;
  std::printf("bench_fused: %s, %d repetitions, FLUX.1 1024x1024 shapes (%lld rows)\n", type.c_str(), reps,
              static_cast<long long>(rows));

  {
    const Tensor x = kiln::bench::uniform_tensor({1, rows, hidden}, dt, 1.0f, 1);
    const Tensor w = kiln::bench::uniform_tensor({mlp, hidden}, dt, 0.02f, 2);
    const Tensor b = kiln::bench::uniform_tensor({mlp}, dt, 0.1f, 3);
    const kiln::LinearEpilogue e{kiln::Activation::GeluTanh, {}, {}};
    compare("mlp_up: gelu_tanh(linear(x [1, 4608, 3072], w [12288, 3072], b))", 2.0 * rows * hidden * mlp,
            {{"fused", [&] { return kiln::linear_fused(x, w, b, e); }, {}},
             {"unfused", [&] { return kiln::gelu(kiln::linear(x, w, b), kiln::GeluApproximate::Tanh); }, {}},
             {"linear", [&] { return kiln::linear(x, w, b); }, {}}},
            reps);
  }
  {
    const Tensor x = kiln::bench::uniform_tensor({1, rows, cat}, dt, 1.0f, 4);
    const Tensor w = kiln::bench::uniform_tensor({hidden, cat}, dt, 0.02f, 5);
    const Tensor b = kiln::bench::uniform_tensor({hidden}, dt, 0.1f, 6);
    const Tensor gate = kiln::bench::uniform_tensor({1, 1, hidden}, dt, 1.0f, 7);
    const Tensor residual = kiln::bench::uniform_tensor({1, rows, hidden}, dt, 1.0f, 8);
    const kiln::LinearEpilogue e{kiln::Activation::None, gate, residual};
    compare("proj_out: residual + gate * linear(x [1, 4608, 15360], w [3072, 15360], b)",
            2.0 * rows * cat * hidden,
            {{"fused", [&] { return kiln::linear_fused(x, w, b, e); }, {}},
             {"unfused", [&] { return kiln::add(residual, kiln::mul(gate, kiln::linear(x, w, b))); }, {}},
             {"linear", [&] { return kiln::linear(x, w, b); }, {}}},
            reps);
  }
  {
    const Tensor x = kiln::bench::uniform_tensor({1, rows, hidden}, dt, 2.0f, 9);
    const Tensor scale = kiln::bench::uniform_tensor({1, 1, hidden}, dt, 0.5f, 10);
    const Tensor shift = kiln::bench::uniform_tensor({1, 1, hidden}, dt, 0.5f, 11);
    const int norm_reps = reps * 10;  // milliseconds each: more repetitions for a stable best
    for (kiln::NormKind kind : {kiln::NormKind::LayerNorm, kiln::NormKind::RmsNorm}) {
      const bool layer = kind == kiln::NormKind::LayerNorm;
      compare(std::string("norm_modulate: ") + (layer ? "layer_norm" : "rms_norm") +
                  "(x [1, 4608, 3072]) * (1 + scale) + shift",
              0,
              {{"fused", [&] { return kiln::norm_modulate(x, scale, shift, kind, 1e-6); }, {}},
               {"unfused",
                [&] {
                  const Tensor h = layer ? kiln::layer_norm(x, 1, {}, {}, 1e-6) : kiln::rms_norm(x, {}, 1e-6);
                  return kiln::add(kiln::mul(h, kiln::add(1.0, scale)), shift);
                },
                {}}},
              norm_reps);
    }
  }
  return 0;
}
