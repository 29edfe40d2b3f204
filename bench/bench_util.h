// Helpers shared by the model benchmarks: best-of timing, random tensors and random model weights.
#pragma once

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/nn/module.h"

namespace kiln::bench {

// CPU seconds used so far by all of the process's threads.
inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Runs `f` once to warm up (primitive creation, weight prepacking), then `reps` times; the best wall time.
inline double best_of(int reps, const std::function<void()>& f) {
  f();
  synchronize();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    synchronize();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Uniform values in [-scale, scale] from std::mt19937(seed), converted to dtype.
inline Tensor uniform_tensor(const Shape& shape, DType dtype, float scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(v, shape).to(dtype);
}

// Wall seconds and CPU seconds (all threads) of one call, its queued kernels included. On a host shared with
// other work the CPU time is the steadier figure: it does not count time slices given to other processes
// (run with OMP_WAIT_POLICY=passive so that idle OpenMP threads do not spin it up).
struct Timing {
  double wall, cpu;
};

inline Timing time_of(const std::function<void()>& f) {
  const double c0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  synchronize();  // Kiln's ops return once queued; time the kernels, not the queueing
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
          process_cpu_seconds() - c0};
}

inline Tensor random(const Shape& shape, DType dtype, Generator& gen, double scale = 0.02) {
  return mul(randn(shape, float32, gen), scale).to(dtype);
}

// Random weights for every parameter a model registers: N(0, 0.02^2) values, 1 for 1-D norm scales, and a
// constant for tensors above `constant_above` elements (position tables), whose values do not change timing.
class RandomWeights : public nn::WeightSource {
 public:
  explicit RandomWeights(nn::Module& model, DType dtype, int64_t constant_above = int64_t{1} << 26)
      : dtype_(dtype), constant_above_(constant_above) {
    for (auto& [name, shape] : model.parameter_shapes()) shapes_[name] = shape;
  }
  bool contains(const std::string& n) const override { return shapes_.count(n) != 0; }
  Shape shape(const std::string& n) const override { return shapes_.at(n); }
  Tensor load(const std::string& n) const override {
    const Shape& s = shapes_.at(n);
    if (n.find("norm") != std::string::npos && s.size() == 1) return Tensor::full(s, 1.0, dtype_);
    if (shape_numel(s) > constant_above_) return Tensor::full(s, 0.01, dtype_);
    return random(s, dtype_, gen_);
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, shape] : shapes_) out.push_back(name);
    return out;
  }
  std::string description() const override { return "random weights"; }

 private:
  DType dtype_;
  int64_t constant_above_;
  std::map<std::string, Shape> shapes_;
  mutable Generator gen_{1};
};

// A FLUX.1-shaped transformer (diffusers' default widths: 3072 = 24 heads x 128, MLP 12288, joint dim 4096;
// 1 double-stream + 1 single-stream block, guidance embedding) with random bf16 weights, and the inputs of
// one step at `size` x `size` pixels with `text_tokens` text tokens.
struct FluxShapedStep {
  std::unique_ptr<models::FluxTransformer2DModel> model;
  Tensor hidden, text, pooled, timestep, guidance, txt_ids, img_ids;
  int64_t image_tokens = 0;
  Tensor forward() const {
    return model->forward(hidden, text, pooled, timestep, guidance, txt_ids, img_ids);
  }
};

// SD3.5 Medium's widths (its config.json) at a cut-down depth: `layers` joint blocks, block 0 with the
// MMDiT-X second attention, QK RMSNorm.
inline models::SD3TransformerConfig sd3_medium_shaped_config(int64_t layers = 2) {
  models::SD3TransformerConfig c;
  c.num_layers = layers;
  c.attention_head_dim = 64;
  c.num_attention_heads = 24;
  c.caption_projection_dim = 1536;
  c.pos_embed_max_size = 384;
  c.dual_attention_layers = {0};
  c.qk_norm = "rms_norm";
  return c;
}

inline FluxShapedStep flux_shaped_step(int64_t size, int64_t text_tokens = 512) {
  models::FluxTransformerConfig config;
  config.num_layers = 1;
  config.num_single_layers = 1;
  config.guidance_embeds = true;
  FluxShapedStep s;
  s.model = std::make_unique<models::FluxTransformer2DModel>(config);
  nn::LoadOptions options;
  options.dtype = bfloat16;
  s.model->load_weights(RandomWeights(*s.model, bfloat16), options);
  const int64_t grid = size / 16;
  s.image_tokens = grid * grid;
  Generator gen(0);
  s.hidden = random({1, s.image_tokens, config.in_channels}, bfloat16, gen, 1.0);
  s.text = random({1, text_tokens, config.joint_attention_dim}, bfloat16, gen, 1.0);
  s.pooled = random({1, config.pooled_projection_dim}, bfloat16, gen, 1.0);
  s.timestep = Tensor::full({1}, 0.5, bfloat16);
  s.guidance = Tensor::full({1}, 3.5, float32);
  s.txt_ids = models::flux_text_ids(text_tokens, bfloat16);
  s.img_ids = models::flux_latent_image_ids(grid, grid, bfloat16);
  return s;
}

}  // namespace kiln::bench
