// The cost of LoRA adapters on the FLUX.1-shaped step (bench_util.h: the real widths, 1 double + 1 single
// block, random bf16 weights, 512x512 = 1024 image tokens + 512 text tokens), issue #29:
//   1. the step with no adapter, with an unfused rank-16 and rank-64 adapter on every Linear of the blocks
//      (q, k, v, the output projections, the MLPs, the modulations: what kohya's all-layers training writes),
//      and with the rank-16 adapter fused, in eager and compiled mode; each configuration timed `reps` times,
//      interleaved, so that the host's load drifts over all of them alike;
//   2. switching between two rank-16 adapters between steps in compiled mode: the time set_adapters takes
//      (rebuilding every layer's combined pair) and the programs built (none);
//   3. one layer of each FLUX shape (attention 3072 -> 3072, MLP up 3072 -> 12288 with gelu, MLP down
//      12288 -> 3072) over the step's 1536 tokens: the plain product, the pair inside it (linear_fused with
//      the low-rank pair: what nn::Linear runs) and the pair apart (its two products, then the product with
//      their result as a residual and the activation after: what ran before), best CPU time of interleaved
//      runs: the steadier figure on a shared host.
// Wall and process CPU time are both printed (the host is shared; CPU time is the steadier figure; run with
// OMP_WAIT_POLICY=passive). Usage: bench_lora_step [repetitions=5] [size=512]
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kiln/nn/layers.h"
#include "kiln/ops.h"
#include "kiln/ops/fused.h"
#include "kiln/runtime/counters.h"

namespace {

using kiln::bench::FluxShapedStep;
using kiln::bench::Timing;

// Every Linear of the transformer's blocks (the embedders and the final layer are left out, as most LoRAs
// do).
std::vector<kiln::nn::Linear*> block_layers(kiln::nn::Module& model) {
  std::vector<kiln::nn::Linear*> out;
  for (const auto& [name, module] : model.named_modules())
    if (auto* l = dynamic_cast<kiln::nn::Linear*>(module);
        l != nullptr && name.find("blocks.") != std::string::npos)
      out.push_back(l);
  return out;
}

void add_adapter(const std::vector<kiln::nn::Linear*>& layers, const std::string& name, int64_t rank,
                 uint32_t seed) {
  for (kiln::nn::Linear* l : layers) {
    // Scaled so that B A is a small change of W (as a trained LoRA's is); the values do not change timing.
    const kiln::Tensor down =
        kiln::bench::uniform_tensor({rank, l->in_features()}, kiln::bfloat16, 0.02f, seed);
    const kiln::Tensor up =
        kiln::bench::uniform_tensor({l->out_features(), rank}, kiln::bfloat16, 0.02f, seed + 1);
    l->add_adapter(name, down, up, 1.0);
    seed += 2;
  }
}

void activate(const std::vector<kiln::nn::Linear*>& layers,
              const std::vector<std::pair<std::string, double>>& a) {
  for (kiln::nn::Linear* l : layers) l->set_active_adapters(a);
}

struct Range {
  std::vector<double> values;
  double min() const { return *std::min_element(values.begin(), values.end()); }
  double max() const { return *std::max_element(values.begin(), values.end()); }
  double median() const {
    std::vector<double> v = values;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

struct Config {
  std::string name;
  std::function<void()> select;  // makes this configuration the model's
  Range wall, cpu;
};

void print(const std::vector<Config>& configs) {
  const Config& base = configs.front();
  std::printf("  %-22s %26s %26s %16s\n", "", "wall ms (min / med / max)", "CPU s (min / med / max)",
              "vs none (CPU med)");
  for (const Config& c : configs)
    std::printf("  %-22s %8.0f %8.0f %8.0f %8.2f %8.2f %8.2f %+15.1f%%\n", c.name.c_str(), c.wall.min() * 1e3,
                c.wall.median() * 1e3, c.wall.max() * 1e3, c.cpu.min(), c.cpu.median(), c.cpu.max(),
                100 * (c.cpu.median() / base.cpu.median() - 1));
}

void step_costs(FluxShapedStep& flux, const std::vector<kiln::nn::Linear*>& layers, bool compiled, int reps) {
  if (compiled) flux.model->compile({.fullgraph = true, .dynamic = false});
  std::vector<Config> configs = {
      {"no adapter", [&] { activate(layers, {}); }, {}, {}},
      {"rank 16, unfused",
       [&] {
         activate(layers, {{"r16", 1.0}});
       },
       {},
       {}},
      {"rank 64, unfused",
       [&] {
         activate(layers, {{"r64", 1.0}});
       },
       {},
       {}},
  };
  for (Config& c : configs) {  // warm-up: programs compiled, weights and adapters packed
    c.select();
    flux.forward();
    kiln::synchronize();
  }
  for (int r = 0; r < reps; ++r)
    for (Config& c : configs) {
      c.select();
      const Timing t = kiln::bench::time_of([&] { flux.forward(); });
      c.wall.values.push_back(t.wall);
      c.cpu.values.push_back(t.cpu);
    }
  // Fused: the rank-16 adapter merged into the weights (owned bf16 copies), then unfused again.
  Config fused{"rank 16, fused", {}, {}, {}};
  activate(layers, {{"r16", 1.0}});
  for (kiln::nn::Linear* l : layers) l->fuse_adapters(1.0);
  flux.forward();
  kiln::synchronize();
  for (int r = 0; r < reps; ++r) {
    const Timing t = kiln::bench::time_of([&] { flux.forward(); });
    fused.wall.values.push_back(t.wall);
    fused.cpu.values.push_back(t.cpu);
  }
  for (kiln::nn::Linear* l : layers) l->unfuse_adapters();
  configs.push_back(fused);
  std::printf("%s mode:\n", compiled ? "compiled" : "eager");
  print(configs);
  if (compiled) flux.model->reset_compiled();
}

void switching(FluxShapedStep& flux, const std::vector<kiln::nn::Linear*>& layers, int reps) {
  flux.model->compile({.fullgraph = true, .dynamic = false});
  activate(layers, {{"r16", 1.0}});
  flux.forward();
  activate(layers, {{"r16b", 1.0}});
  flux.forward();
  kiln::synchronize();
  const int64_t compiled_before = kiln::counters().graphs_compiled;
  Range set_wall, step_cpu;
  for (int r = 0; r < reps; ++r)
    for (const char* name : {"r16", "r16b"}) {
      set_wall.values.push_back(kiln::bench::time_of([&] {
                                  activate(layers, {{name, 0.5 + r * 0.1}});
                                }).wall);
      step_cpu.values.push_back(kiln::bench::time_of([&] { flux.forward(); }).cpu);
    }
  std::printf(
      "switching between two rank-16 adapters (and their weights) between compiled steps, %d switches:\n"
      "  set_adapters over %zu layers: %.1f / %.1f / %.1f ms wall (min / med / max); step after a switch "
      "%.2f / "
      "%.2f / %.2f s CPU; programs built by the switches: %lld\n",
      2 * reps, layers.size(), set_wall.min() * 1e3, set_wall.median() * 1e3, set_wall.max() * 1e3,
      step_cpu.min(), step_cpu.median(), step_cpu.max(),
      static_cast<long long>(kiln::counters().graphs_compiled - compiled_before));
  flux.model->reset_compiled();
}

void per_layer(int64_t tokens, int reps) {
  using kiln::Activation;
  using kiln::LinearEpilogue;
  using kiln::Tensor;
  struct Shape3 {
    const char* name;
    int64_t k, n;
    Activation act;
  };
  std::printf("one layer, %lld tokens, bf16 (best process CPU time of %d interleaved runs):\n",
              static_cast<long long>(tokens), reps);
  for (const Shape3& s : {Shape3{"attention 3072 -> 3072", 3072, 3072, Activation::None},
                          Shape3{"MLP up 3072 -> 12288 + gelu", 3072, 12288, Activation::GeluTanh},
                          Shape3{"MLP down 12288 -> 3072", 12288, 3072, Activation::None}}) {
    const Tensor x = kiln::bench::uniform_tensor({tokens, s.k}, kiln::bfloat16, 1.0f, 1);
    const Tensor w = kiln::bench::uniform_tensor({s.n, s.k}, kiln::bfloat16, 0.02f, 2);
    for (int64_t rank : {16, 64}) {
      const Tensor down = kiln::bench::uniform_tensor({rank, s.k}, kiln::bfloat16, 0.02f, 3);
      const Tensor up = kiln::bench::uniform_tensor({s.n, rank}, kiln::bfloat16, 0.02f, 4);
      Tensor out;
      const std::function<void()> runs[] = {
          [&] { out = kiln::linear_fused(x, w, Tensor(), {.act = s.act}); },
          [&] {
            out =
                kiln::linear_fused(x, w, Tensor(), {.act = s.act, .low_rank_down = down, .low_rank_up = up});
          },
          [&] {
            const Tensor pair = kiln::linear(kiln::linear(x, down), up);
            out = kiln::linear_fused(x, w, Tensor(), {.residual = pair});
            if (s.act != Activation::None) out = kiln::gelu(out, kiln::GeluApproximate::Tanh);
          }};
      double best[3] = {1e30, 1e30, 1e30};
      for (const auto& run : runs) run();  // warm-up: primitives made, the weight packed
      for (int r = 0; r < reps; ++r)
        for (int i = 0; i < 3; ++i) best[i] = std::min(best[i], kiln::bench::time_of(runs[i]).cpu);
      std::printf("  %-28s rank %-3lld plain %7.1f ms   pair inside %+5.1f%%   pair apart %+5.1f%%\n", s.name,
                  static_cast<long long>(rank), best[0] * 1e3, 100 * (best[1] - best[0]) / best[0],
                  100 * (best[2] - best[0]) / best[0]);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const int64_t size = argc > 2 ? std::atoll(argv[2]) : 512;
  FluxShapedStep flux = kiln::bench::flux_shaped_step(size);
  const std::vector<kiln::nn::Linear*> layers = block_layers(*flux.model);
  add_adapter(layers, "r16", 16, 1);
  add_adapter(layers, "r64", 64, 1000);
  add_adapter(layers, "r16b", 16, 2000);
  std::printf(
      "FLUX.1-shaped step (1 double + 1 single block, width 3072), bf16, %lldx%lld, 512 text tokens; "
      "adapters on %zu layers; %d repetitions\n",
      static_cast<long long>(size), static_cast<long long>(size), layers.size(), reps);
  step_costs(flux, layers, false, reps);
  step_costs(flux, layers, true, reps);
  switching(flux, layers, reps);
  per_layer(size * size / 256 + 512, std::max(reps, 4));
  return 0;
}
