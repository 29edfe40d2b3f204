// Baseline figures for the FLUX.1 transformer step (the performance work measures itself against these):
//   1. the tiny test pipeline (tests/data/models/flux-tiny-schnell): one transformer step and a full
//      4-step text-to-image call at 64x64;
//   2. a FLUX.1-shaped transformer with the real widths (3072 = 24 heads x 128, MLP 12288, joint dim 4096)
//      but 1 double-stream + 1 single-stream block, random bf16 weights, at 512x512 (1024 image tokens) with
//      512 text tokens: step time, GFLOP/s against the bf16 ceiling measured after it (bf16_ceiling.h), and
//      how much of the step its matmuls and its attention take when timed alone on the same shapes.
// Usage: bench_flux_step [repetitions=3] [data_dir=tests/data]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench_util.h"
#include "bf16_ceiling.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/kiln.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/ops/attention.h"

namespace {

using kiln::bench::best_of;
using kiln::bench::random;

void tiny(const std::string& data, int reps) {
  const std::string dir = data + "/models/flux-tiny-schnell";
  auto pipe = kiln::FluxPipeline::from_pretrained(dir);
  kiln::Generator gen(0);
  const auto prompt = pipe.encode_prompt("a photo of a cat", std::nullopt, 1, 32);
  auto [latents, ids] = pipe.prepare_latents(1, 64, 64, kiln::float32, gen);
  const kiln::Tensor t = kiln::Tensor::full({1}, 1.0, kiln::float32);
  const double step = best_of(reps, [&] {
    pipe.transformer().forward(latents, prompt.prompt_embeds, prompt.pooled_prompt_embeds, t, {},
                               prompt.text_ids, ids);
  });
  kiln::PipelineRequest call;
  call.prompt = "a photo of a cat";
  call.height = call.width = 64;
  call.num_inference_steps = 4;
  call.max_sequence_length = 32;
  call.generator = kiln::Generator(0);
  const double e2e = best_of(reps, [&] { pipe(call); });
  std::printf("tiny FLUX (2+2 blocks, width 32), f32, 64x64, 32 text tokens:\n");
  std::printf("  transformer step      %8.2f ms\n", step * 1e3);
  std::printf("  text-to-image, 4 steps %7.2f ms (prompt encoding, 4 steps, VAE decode)\n\n", e2e * 1e3);
}

void flux_shaped(int reps) {
  using kiln::bfloat16;
  const kiln::bench::FluxShapedStep flux = kiln::bench::flux_shaped_step(512);
  const kiln::models::FluxTransformerConfig& config = flux.model->config();
  const int64_t N = flux.image_tokens, L = flux.text.size(1), S = N + L, D = config.inner_dim(),
                H = config.num_attention_heads, Dh = config.attention_head_dim, F = 4 * D;
  kiln::Generator gen(0);
  const double step = best_of(reps, [&] { flux.forward(); });

  // The step's matmuls, each timed alone on its shape (M rows x K -> N): per double block the image and
  // text streams each have q, k, v, out (D -> D) and the MLP (D -> F -> D); the single block has q, k, v
  // (D -> D), proj_mlp (D -> F) and proj_out (D + F -> D) over all S tokens. Modulation and embedding
  // linears run on one row and are left out.
  struct Shape3 {
    int64_t m, k, n, count;
  };
  const std::vector<Shape3> linears = {{N, D, D, 4}, {N, D, F, 1}, {N, F, D, 1},
                                       {L, D, D, 4}, {L, D, F, 1}, {L, F, D, 1},
                                       {S, D, D, 3}, {S, D, F, 1}, {S, D + F, D, 1}};
  double matmul = 0, linear_flops = 0;
  for (const auto& s : linears) {
    const kiln::Tensor x = random({s.m, s.k}, bfloat16, gen, 1.0);
    const kiln::Tensor w = random({s.n, s.k}, bfloat16, gen);
    const kiln::Tensor b = random({s.n}, bfloat16, gen);
    matmul += s.count * best_of(reps, [&] { kiln::linear(x, w, b); });
    linear_flops += 2.0 * s.m * s.k * s.n * s.count;
  }
  const kiln::Tensor q = random({1, H, S, Dh}, bfloat16, gen, 1.0);
  const double attention = 2 * best_of(reps, [&] { kiln::scaled_dot_product_attention(q, q, q); });
  const double attention_flops = 2 * 4.0 * S * S * D;
  const double flops = linear_flops + attention_flops;

  std::printf(
      "FLUX.1-shaped transformer (1 double + 1 single block, width %lld), bf16, 512x512 (%lld image + %lld "
      "text tokens):\n",
      static_cast<long long>(D), static_cast<long long>(N), static_cast<long long>(L));
  const kiln::bench::Bf16Ceiling ceiling = kiln::bench::measure_bf16_ceiling();
  std::printf(
      "  step                 %8.1f ms  %6.1f GFLOP  %6.1f GFLOP/s  %5.1f%% of the measured ceiling %.0f "
      "(%s)\n",
      step * 1e3, flops / 1e9, flops / step / 1e9, 100 * flops / step / 1e9 / ceiling.gflops, ceiling.gflops,
      ceiling.instruction);
  std::printf("  matmuls alone        %8.1f ms  (%.0f%% of the step, %.1f GFLOP/s)\n", matmul * 1e3,
              100 * matmul / step, linear_flops / matmul / 1e9);
  std::printf("  attention alone      %8.1f ms  (%.0f%% of the step, %.1f GFLOP/s)\n", attention * 1e3,
              100 * attention / step, attention_flops / attention / 1e9);
  std::printf("  everything else      %8.1f ms  (%.0f%%: norms, modulation, RoPE, activations, copies)\n",
              (step - matmul - attention) * 1e3, 100 * (step - matmul - attention) / step);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 3;
  const std::string data = argc > 2 ? argv[2] : "tests/data";
  tiny(data, reps);
  flux_shaped(reps);
  return 0;
}
