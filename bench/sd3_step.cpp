// Per-step time of an SD3.5-Medium-shaped transformer (the real widths: 24 heads x 64 = 1536, joint dim 4096,
// pooled 2048, MMDiT-X dual attention in the first block, QK RMSNorm) with its depth cut to 2 blocks, bf16,
// random weights, at 512x512 and 1024x1024 with classifier-free guidance as one batch of 2 (333 text tokens:
// 77 CLIP + 256 T5). Prints the step time, GFLOP/s against the bf16 ceiling measured after it
// (bf16_ceiling.h: the fastest instruction a bf16 product can use on this host), and the extrapolation
// to the full 24-block model. Usage: bench_sd3_step [repetitions=2] [sizes: 512,1024]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_util.h"
#include "bf16_ceiling.h"
#include "kiln/models/sd3_transformer.h"

namespace {

void run(int64_t image, int reps) {
  using kiln::bfloat16;
  const kiln::models::SD3TransformerConfig config = kiln::bench::sd3_medium_shaped_config();
  kiln::models::SD3Transformer2DModel model(config);
  kiln::nn::LoadOptions options;
  options.dtype = bfloat16;
  model.load_weights(kiln::bench::RandomWeights(model, bfloat16), options);

  const int64_t B = 2, L = 333, h = image / 8, D = config.inner_dim();
  const int64_t N = (h / config.patch_size) * (h / config.patch_size), S = N + L;
  kiln::Generator gen(0);
  const kiln::Tensor latents = kiln::bench::random({B, config.in_channels, h, h}, bfloat16, gen, 1.0);
  const kiln::Tensor text = kiln::bench::random({B, L, config.joint_attention_dim}, bfloat16, gen, 1.0);
  const kiln::Tensor pooled = kiln::bench::random({B, config.pooled_projection_dim}, bfloat16, gen, 1.0);
  const kiln::Tensor t = kiln::Tensor::full({B}, 500.0, kiln::float32);
  const double step = kiln::bench::best_of(reps, [&] { model.forward(latents, text, pooled, t); });

  // FLOPs per joint block per batch element: q,k,v,o + 4x MLP on image and text streams = 2*S*D*D*12, and
  // attention 4*S^2*D; the dual-attention block adds image-only q,k,v,o (8*N*D*D) and 4*N^2*D.
  const double block = 24.0 * S * D * D + 4.0 * S * S * D;
  const double dual_extra = 8.0 * N * D * D + 4.0 * N * N * D;
  const double flops = B * (config.num_layers * block + dual_extra);
  std::printf(
      "SD3.5-Medium-shaped, 2 blocks (1 dual), bf16, %lldx%lld, CFG batch 2, %lld image + %lld text "
      "tokens:\n",
      static_cast<long long>(image), static_cast<long long>(image), static_cast<long long>(N),
      static_cast<long long>(L));
  const kiln::bench::Bf16Ceiling ceiling = kiln::bench::measure_bf16_ceiling();
  std::printf("  step %8.1f ms  %6.1f GFLOP/s  %5.1f%% of the measured ceiling %.0f (%s)\n", step * 1e3,
              flops / step / 1e9, 100 * flops / step / 1e9 / ceiling.gflops, ceiling.gflops,
              ceiling.instruction);
  // Medium has 24 blocks, 13 of them dual (dual_attention_layers 0..12).
  const double full = step / flops * B * (24 * block + 13 * dual_extra);
  std::printf("  full 24-block SD3.5 Medium, extrapolated: %.1f s per step\n", full);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::string sizes = argc > 2 ? argv[2] : "512,1024";
  if (sizes.find("512") != std::string::npos) run(512, reps);
  if (sizes.find("1024") != std::string::npos) run(1024, reps);
  return 0;
}
