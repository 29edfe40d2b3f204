// The Kiln side of bench/compare/compare.py: one model, one input size, one execution mode per process (so
// that the peak resident memory it reports is that engine's alone). It loads a diffusers/transformers
// checkpoint folder written by compare.py (or makes random weights with --random), runs the forward pass
// `--steps` times after one warm-up, and prints one table row and one machine-readable line:
//   step time (median, min, max), model FLOPs per step, model-FLOP utilisation against the bf16 ceiling it
//   measures in the same run (bf16_ceiling.h: register-only loops of every instruction a bf16 product can
//   use, on every thread; the fastest), the time of the step's matmuls when each Linear shape is timed alone
//   (kiln::linear), the peak resident memory (VmHWM) and the weights' size, and, when the inputs file holds
//   PyTorch's output for the same inputs ("expected"), the max relative error max|kiln - torch| / max|torch|.
//
// Usage:
//   bench_compare_driver --model flux|flux2|sd3|zimage|qwenimage|t5|sd15|sdxl
//                        [--mode eager|fuse|compile|compile-blocks] [--steps N]
//                        (--checkpoint DIR [--inputs FILE] | --random [--size PX] [--layers N] [--tiny])
//                        [--matmul-reps N (0 = skip the matmul timing)]
// --size is the image side in pixels for flux, flux2, sd3, zimage, qwenimage, sd15 and sdxl (512, 1024) and
// the token count for t5. zimage is Z-Image-Turbo-shaped (width 3840, 30 heads, a 160-token caption of 2560):
// --layers main layers (default 2) after one noise and one context refiner block. qwenimage is
// Qwen-Image-shaped (QwenImageTransformer2DModel's defaults: width 3072, 24 heads of 128, 200 text tokens of
// Qwen2.5-VL's 3584, every token valid): --layers dual-stream blocks (default 2) of the real 60, and the
// FLOPs of the full depth are reported too. One call of the transformer: with true classifier-free guidance,
// QwenImagePipeline's step is two such calls (the prompt's and the negative prompt's).
// --layers: flux and flux2 double and single blocks each (default 1), sd3 blocks (default 2; block 0 has the
// dual attention), t5 layers (default 2). flux2 is FLUX.2-dev-shaped (width 6144, 48 heads, 512 text tokens
// of 15360). sd15 is Stable Diffusion 1.5's UNet2DConditionModel at its full depth; sdxl is SDXL base's with
// --layers transformer blocks per spatial transformer at its deepest level and in the middle block (default
// 2; the real model has 10; sd15 ignores --layers). Both run a guided batch of 2 with 77 text tokens (SDXL:
// its pooled prompt and time ids too); for a cut SDXL the driver also reports the FLOPs of the full depth.
// --tiny shrinks every width (for the ctest; the timings mean nothing). Modes: eager (strict eager), fuse
// (EagerMode::DeferAndFuse), compile (Module::compile()), compile-blocks (Module::compile_repeated_blocks());
// the first call, which traces and compiles, is reported separately.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <omp.h>

#include "../bench_util.h"
#include "../bf16_ceiling.h"
#include "backends/cpu/cpu_features.h"
#include "kiln/families/qwen_image/qwen_image_transformer.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/families/z_image/z_image_transformer.h"
#include "kiln/io/safetensors.h"
#include "kiln/kiln.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/models/t5_encoder.h"

namespace {

struct Options {
  std::string model;
  std::string mode = "eager";
  std::string checkpoint;
  std::string inputs;
  bool random = false;
  bool tiny = false;
  int64_t size = 512;
  int64_t layers = 0;  // 0: the model's default cut-down depth
  int steps = 3;
  int matmul_reps = 1;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_compare_driver: %s\nusage: bench_compare_driver --model "
               "flux|flux2|sd3|zimage|qwenimage|t5|sd15|sdxl "
               "[--mode eager|fuse|compile|compile-blocks] [--steps N] (--checkpoint DIR [--inputs FILE] | "
               "--random [--size PX] [--layers N] [--tiny]) [--matmul-reps N]\n",
               why.c_str());
  std::exit(2);
}

int64_t parse_int(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const long long v = std::stoll(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  usage(flag + " expects an integer, got '" + value + "'");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--model")
      o.model = value();
    else if (a == "--mode")
      o.mode = value();
    else if (a == "--checkpoint")
      o.checkpoint = value();
    else if (a == "--inputs")
      o.inputs = value();
    else if (a == "--random")
      o.random = true;
    else if (a == "--tiny")
      o.tiny = true;
    else if (a == "--size")
      o.size = parse_int(a, value());
    else if (a == "--layers")
      o.layers = parse_int(a, value());
    else if (a == "--steps")
      o.steps = static_cast<int>(parse_int(a, value()));
    else if (a == "--matmul-reps")
      o.matmul_reps = static_cast<int>(parse_int(a, value()));
    else
      usage("unknown argument '" + a + "'");
  }
  if (o.model != "flux" && o.model != "flux2" && o.model != "sd3" && o.model != "zimage" &&
      o.model != "qwenimage" && o.model != "t5" && o.model != "sd15" && o.model != "sdxl")
    usage("--model must be flux, flux2, sd3, zimage, qwenimage, t5, sd15 or sdxl");
  if (o.mode != "eager" && o.mode != "fuse" && o.mode != "compile" && o.mode != "compile-blocks")
    usage("--mode must be eager, fuse, compile or compile-blocks");
  if (o.random == !o.checkpoint.empty()) usage("give exactly one of --checkpoint DIR and --random");
  if (o.steps < 1) usage("--steps must be at least 1");
  if (o.size < 1 || o.layers < 0 || o.matmul_reps < 0)
    usage("--size, --layers and --matmul-reps must be positive");
  return o;
}

// ---- measurements of the machine and the process

// Peak resident set of this process (VmHWM), in bytes.
double peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return 1024.0 * std::atof(line.c_str() + 6);
  }
  return 0;
}

struct Timing {
  double median = 0, min = 0, max = 0;
  double first = 0;  // the warm-up call (in the compiled modes: tracing and compiling included)
  // Process CPU time over wall time across the timed steps: how many cores were busy on average. With
  // OMP_WAIT_POLICY=passive (idle OpenMP threads sleep instead of spinning) a serial stretch between
  // parallel kernels shows up as a figure below the thread count.
  double cores_busy = 0;
  // Fresh memory the CPU allocator took from the system per timed step (its cache missed), on average.
  double fresh_allocations = 0;
};

Timing time_steps(int steps, const std::function<void()>& f) {
  const kiln::RepeatedShapesScope repeated(kiln::cpu);  // as the pipelines' denoising loop has it
  const auto t_first = std::chrono::steady_clock::now();
  f();  // warm-up: primitive creation, weight prepacking, first-touch of the allocator, compiling
  kiln::synchronize();
  const double first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_first).count();
  std::vector<double> t;
  const int64_t fresh0 = kiln::memory_stats(kiln::cpu).system_allocations;
  const double cpu0 = kiln::bench::process_cpu_seconds();
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    kiln::synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double cpu = kiln::bench::process_cpu_seconds() - cpu0,
               wall = std::accumulate(t.begin(), t.end(), 0.0);
  const double fresh =
      static_cast<double>(kiln::memory_stats(kiln::cpu).system_allocations - fresh0) / std::max(steps, 1);
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  return {n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]), t.front(), t.back(), first, cpu / wall, fresh};
}

// ---- the models' work

// A Linear applied to `m` rows, `count` times per step: 2 m k n FLOPs each.
struct LinearShape {
  int64_t m, k, n, count;
};

struct Workload {
  std::string description;
  std::vector<LinearShape> linears;  // every Linear/conv whose rows scale with the tokens
  double attention_flops = 0;        // QK^T and PV: 4 S^2 (heads x head_dim) per attention
  double linear_flops() const {
    double f = 0;
    for (const auto& l : linears) f += 2.0 * l.m * l.k * l.n * l.count;
    return f;
  }
};

// Model FLOPs leave out the modulation/embedding linears that act on one row per batch element (under 0.1%
// of a step) and all elementwise work.
Workload flux_workload(const kiln::models::FluxTransformerConfig& c, int64_t batch, int64_t n, int64_t l) {
  const int64_t d = c.inner_dim(), f = 4 * d, s = n + l, b = batch;
  Workload w;
  w.linears = {
      {b * n, c.in_channels, d, 1}, {b * l, c.joint_attention_dim, d, 1}, {b * n, d, c.out_channels, 1}};
  if (c.num_layers > 0) {
    const int64_t k = c.num_layers;
    w.linears.insert(w.linears.end(), {{b * n, d, d, 4 * k},
                                       {b * n, d, f, k},
                                       {b * n, f, d, k},
                                       {b * l, d, d, 4 * k},
                                       {b * l, d, f, k},
                                       {b * l, f, d, k}});
  }
  if (c.num_single_layers > 0) {
    const int64_t k = c.num_single_layers;
    w.linears.insert(w.linears.end(), {{b * s, d, d, 3 * k}, {b * s, d, f, k}, {b * s, d + f, d, k}});
  }
  w.attention_flops = 4.0 * b * s * s * d * (c.num_layers + c.num_single_layers);
  return w;
}

// FLUX.2: no biases, SwiGLU feed-forwards (linear_in to 2 x 3d, linear_out from 3d), the single block's fused
// [q | k | v | gate | up] projection and [attention | mlp] output.
Workload flux2_workload(const kiln::models::Flux2TransformerConfig& c, int64_t batch, int64_t n, int64_t l) {
  const int64_t d = c.inner_dim(), f = c.mlp_hidden_dim(), s = n + l, b = batch;
  Workload w;
  w.linears = {
      {b * n, c.in_channels, d, 1}, {b * l, c.joint_attention_dim, d, 1}, {b * n, d, c.out_channels, 1}};
  if (c.num_layers > 0) {
    const int64_t k = c.num_layers;
    w.linears.insert(w.linears.end(), {{b * n, d, d, 4 * k},
                                       {b * n, d, 2 * f, k},
                                       {b * n, f, d, k},
                                       {b * l, d, d, 4 * k},
                                       {b * l, d, 2 * f, k},
                                       {b * l, f, d, k}});
  }
  if (c.num_single_layers > 0) {
    const int64_t k = c.num_single_layers;
    w.linears.insert(w.linears.end(), {{b * s, d, 3 * d + 2 * f, k}, {b * s, d + f, d, k}});
  }
  w.attention_flops = 4.0 * b * s * s * d * (c.num_layers + c.num_single_layers);
  return w;
}

Workload sd3_workload(const kiln::models::SD3TransformerConfig& c, int64_t batch, int64_t n, int64_t l) {
  const int64_t d = c.inner_dim(), f = 4 * d, s = n + l, b = batch, p = c.patch_size;
  int64_t dual = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) dual += c.is_dual_attention_layer(i) ? 1 : 0;
  const int64_t k = c.num_layers;
  Workload w;
  // Patch embedding (a stride-p conv = a Linear on patches), caption projection and the final projection.
  w.linears = {{b * n, c.in_channels * p * p, d, 1},
               {b * l, c.joint_attention_dim, d, 1},
               {b * n, d, p * p * c.out_channels, 1},
               // image stream of every block: q, k, v, out and the MLP
               {b * n, d, d, 4 * k},
               {b * n, d, f, k},
               {b * n, f, d, k},
               // text stream: q, k, v everywhere; out and MLP except in the last block (context_pre_only)
               {b * l, d, d, 3 * k + (k - 1)},
               {b * l, d, f, k - 1},
               {b * l, f, d, k - 1}};
  if (dual > 0) w.linears.push_back({b * n, d, d, 4 * dual});  // MMDiT-X second, image-only attention
  w.attention_flops = 4.0 * b * (static_cast<double>(s) * s * k + static_cast<double>(n) * n * dual) * d;
  return w;
}

Workload t5_workload(const kiln::models::T5EncoderConfig& c, int64_t batch, int64_t s) {
  const int64_t inner = c.num_heads * c.d_kv, m = batch * s, k = c.num_layers;
  Workload w;
  w.linears = {{m, c.d_model, inner, 3 * k},
               {m, inner, c.d_model, k},
               {m, c.d_model, c.d_ff, (c.gated ? 2 : 1) * k},
               {m, c.d_ff, c.d_model, k}};
  w.attention_flops = 4.0 * batch * s * s * inner * k;
  return w;
}

// Each Linear shape timed alone with kiln::linear (bf16, bias as the model has it where it matters little).
double matmul_seconds(const Workload& w, int reps) {
  kiln::Generator gen(7);
  double total = 0;
  for (const auto& l : w.linears) {
    const kiln::Tensor x = kiln::bench::random({l.m, l.k}, kiln::bfloat16, gen, 1.0);
    const kiln::Tensor weight = kiln::bench::random({l.n, l.k}, kiln::bfloat16, gen);
    const kiln::Tensor bias = kiln::bench::random({l.n}, kiln::bfloat16, gen);
    total += l.count * kiln::bench::best_of(reps, [&] { kiln::linear(x, weight, bias); });
  }
  return total;
}

// ---- building the model and its inputs

struct Case {
  std::unique_ptr<kiln::nn::Module> model;
  std::function<kiln::Tensor()> step;
  Workload work;
  std::optional<kiln::Tensor> expected;
  double full_depth_flops = NAN;  // a cut model's FLOPs per step at its real depth (sdxl, qwenimage)
};

// The inputs file written by compare.py: named input tensors and, optionally, PyTorch's output.
struct InputFile {
  std::unique_ptr<kiln::io::SafetensorsFile> file;
  kiln::Tensor get(const std::string& name) const {
    KILN_CHECK(file->contains(name), "bench_compare_driver: the inputs file has no tensor '" << name << "'");
    return file->tensor(name).contiguous();
  }
  std::optional<kiln::Tensor> expected() const {
    if (!file || !file->contains("expected")) return std::nullopt;
    return file->tensor("expected");
  }
};

kiln::models::FluxTransformerConfig flux_random_config(const Options& o) {
  kiln::models::FluxTransformerConfig c;  // diffusers' defaults are the FLUX.1 widths
  c.guidance_embeds = true;               // FLUX.1-dev
  c.num_layers = c.num_single_layers = o.layers > 0 ? o.layers : 1;
  if (o.tiny) {
    c.num_attention_heads = 2;
    c.attention_head_dim = 16;
    c.axes_dims_rope = {4, 6, 6};
    c.joint_attention_dim = 32;
    c.pooled_projection_dim = 16;
    c.in_channels = c.out_channels = 16;
  }
  return c;
}

Case flux_case(const Options& o, const InputFile& in) {
  using kiln::bfloat16;
  std::unique_ptr<kiln::models::FluxTransformer2DModel> model;
  kiln::Tensor hidden, text, pooled, t, g, txt_ids, img_ids;
  if (o.random) {
    const auto c = flux_random_config(o);
    model = std::make_unique<kiln::models::FluxTransformer2DModel>(c);
    kiln::nn::LoadOptions load;
    load.dtype = bfloat16;
    model->load_weights(kiln::bench::RandomWeights(*model, bfloat16), load);
    const int64_t grid = o.size / 16, n = grid * grid, l = o.tiny ? 8 : 512;
    kiln::Generator gen(0);
    hidden = kiln::bench::random({1, n, c.in_channels}, bfloat16, gen, 1.0);
    text = kiln::bench::random({1, l, c.joint_attention_dim}, bfloat16, gen, 1.0);
    pooled = kiln::bench::random({1, c.pooled_projection_dim}, bfloat16, gen, 1.0);
    t = kiln::Tensor::full({1}, 0.5, kiln::float32);
    g = kiln::Tensor::full({1}, 3.5, kiln::float32);
    txt_ids = kiln::models::flux_text_ids(l);
    img_ids = kiln::models::flux_latent_image_ids(grid, grid);
  } else {
    model = kiln::models::load_flux_transformer(o.checkpoint, bfloat16);
    hidden = in.get("hidden_states");
    text = in.get("encoder_hidden_states");
    pooled = in.get("pooled_projections");
    t = in.get("timestep");
    if (model->config().guidance_embeds) g = in.get("guidance");
    txt_ids = in.get("txt_ids");
    img_ids = in.get("img_ids");
  }
  const auto& c = model->config();
  Case out;
  out.work = flux_workload(c, hidden.shape()[0], hidden.shape()[1], text.shape()[1]);
  std::ostringstream d;
  d << "flux " << c.num_layers << "+" << c.num_single_layers << " blocks, width " << c.inner_dim() << ", "
    << hidden.shape()[1] << " image + " << text.shape()[1] << " text tokens";
  out.work.description = d.str();
  auto* m = model.get();
  out.step = [=] { return m->forward(hidden, text, pooled, t, g, txt_ids, img_ids); };
  out.model = std::move(model);
  return out;
}

kiln::models::Flux2TransformerConfig flux2_random_config(const Options& o) {
  kiln::models::Flux2TransformerConfig c;  // diffusers' defaults are the FLUX.2-dev widths
  c.num_layers = c.num_single_layers = o.layers > 0 ? o.layers : 1;
  if (o.tiny) {
    c.num_attention_heads = 2;
    c.attention_head_dim = 16;
    c.axes_dims_rope = {2, 6, 4, 4};
    c.joint_attention_dim = 48;
    c.in_channels = c.out_channels = 32;
  }
  return c;
}

Case flux2_case(const Options& o, const InputFile& in) {
  using kiln::bfloat16;
  std::unique_ptr<kiln::models::Flux2Transformer2DModel> model;
  kiln::Tensor hidden, text, t, g, txt_ids, img_ids;
  if (o.random) {
    const auto c = flux2_random_config(o);
    model = std::make_unique<kiln::models::Flux2Transformer2DModel>(c);
    kiln::nn::LoadOptions load;
    load.dtype = bfloat16;
    model->load_weights(kiln::bench::RandomWeights(*model, bfloat16), load);
    const int64_t grid = o.size / 16, n = grid * grid, l = o.tiny ? 8 : 512;
    kiln::Generator gen(0);
    hidden = kiln::bench::random({1, n, c.in_channels}, bfloat16, gen, 1.0);
    text = kiln::bench::random({1, l, c.joint_attention_dim}, bfloat16, gen, 1.0);
    t = kiln::Tensor::full({1}, 1.0, bfloat16);
    g = kiln::Tensor::full({1}, 4.0, kiln::float32);
    txt_ids = kiln::models::flux2_text_ids(l);
    img_ids = kiln::models::flux2_latent_ids(grid, grid);
  } else {
    model = kiln::models::load_flux2_transformer(o.checkpoint, bfloat16);
    hidden = in.get("hidden_states");
    text = in.get("encoder_hidden_states");
    t = in.get("timestep");
    g = in.get("guidance");
    txt_ids = in.get("txt_ids");
    img_ids = in.get("img_ids");
  }
  const auto& c = model->config();
  Case out;
  out.work = flux2_workload(c, hidden.shape()[0], hidden.shape()[1], text.shape()[1]);
  std::ostringstream d;
  d << "flux2 " << c.num_layers << "+" << c.num_single_layers << " blocks, width " << c.inner_dim() << ", "
    << hidden.shape()[1] << " image + " << text.shape()[1] << " text tokens";
  out.work.description = d.str();
  auto* m = model.get();
  out.step = [=] { return m->forward(hidden, text, t, g, txt_ids, img_ids); };
  out.model = std::move(model);
  return out;
}

kiln::models::SD3TransformerConfig sd3_random_config(const Options& o) {
  kiln::models::SD3TransformerConfig c = kiln::bench::sd3_medium_shaped_config(o.layers > 0 ? o.layers : 2);
  if (o.tiny) {
    c.num_attention_heads = 2;
    c.attention_head_dim = 16;
    c.caption_projection_dim = 32;
    c.joint_attention_dim = 32;
    c.pooled_projection_dim = 16;
    c.pos_embed_max_size = 16;
    c.sample_size = 8;
  }
  return c;
}

Case sd3_case(const Options& o, const InputFile& in) {
  using kiln::bfloat16;
  std::unique_ptr<kiln::models::SD3Transformer2DModel> model;
  kiln::Tensor hidden, text, pooled, t;
  if (o.random) {
    const auto c = sd3_random_config(o);
    model = std::make_unique<kiln::models::SD3Transformer2DModel>(c);
    kiln::nn::LoadOptions load;
    load.dtype = bfloat16;
    model->load_weights(kiln::bench::RandomWeights(*model, bfloat16), load);
    // Classifier-free guidance as one batch of 2; 333 text tokens = 77 CLIP + 256 T5.
    const int64_t b = 2, l = o.tiny ? 8 : 333, h = o.size / 8;
    kiln::Generator gen(0);
    hidden = kiln::bench::random({b, c.in_channels, h, h}, bfloat16, gen, 1.0);
    text = kiln::bench::random({b, l, c.joint_attention_dim}, bfloat16, gen, 1.0);
    pooled = kiln::bench::random({b, c.pooled_projection_dim}, bfloat16, gen, 1.0);
    t = kiln::Tensor::full({b}, 500.0, kiln::float32);
  } else {
    model = kiln::models::load_sd3_transformer(o.checkpoint, bfloat16);
    hidden = in.get("hidden_states");
    text = in.get("encoder_hidden_states");
    pooled = in.get("pooled_projections");
    t = in.get("timestep");
  }
  const auto& c = model->config();
  const int64_t n = (hidden.shape()[2] / c.patch_size) * (hidden.shape()[3] / c.patch_size);
  Case out;
  out.work = sd3_workload(c, hidden.shape()[0], n, text.shape()[1]);
  std::ostringstream d;
  d << "sd3 " << c.num_layers << " blocks, width " << c.inner_dim() << ", batch " << hidden.shape()[0]
    << " x (" << n << " image + " << text.shape()[1] << " text tokens)";
  out.work.description = d.str();
  auto* m = model.get();
  out.step = [=] { return m->forward(hidden, text, pooled, t); };
  out.model = std::move(model);
  return out;
}

kiln::models::T5EncoderConfig t5_random_config(const Options& o) {
  kiln::models::T5EncoderConfig c;  // T5 v1.1 XXL widths (FLUX.1's and SD3's text encoder 3)
  c.d_model = 4096;
  c.d_kv = 64;
  c.num_heads = 64;
  c.d_ff = 10240;
  c.num_layers = o.layers > 0 ? o.layers : 2;
  if (o.tiny) {
    c.vocab_size = 100;
    c.d_model = 32;
    c.d_kv = 8;
    c.num_heads = 4;
    c.d_ff = 64;
  }
  return c;
}

Case t5_case(const Options& o, const InputFile& in) {
  std::unique_ptr<kiln::models::T5EncoderModel> model;
  kiln::Tensor ids;
  if (o.random) {
    const auto c = t5_random_config(o);
    model = std::make_unique<kiln::models::T5EncoderModel>(c);
    kiln::nn::LoadOptions load;
    load.dtype = kiln::bfloat16;
    model->load_weights(kiln::bench::RandomWeights(*model, kiln::bfloat16), load);
    std::vector<int64_t> v(static_cast<size_t>(o.size));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 7919 + 13) % c.vocab_size);
    ids = kiln::Tensor::from_vector(v, {1, o.size});
  } else {
    model = kiln::models::load_t5_encoder(o.checkpoint, kiln::bfloat16);
    ids = in.get("input_ids");
  }
  const auto& c = model->config();
  Case out;
  out.work = t5_workload(c, ids.shape()[0], ids.shape()[1]);
  std::ostringstream d;
  d << "t5 " << c.num_layers << " layers, width " << c.d_model << ", " << ids.shape()[1] << " tokens";
  out.work.description = d.str();
  auto* m = model.get();
  out.step = [=] { return m->forward(ids); };
  out.model = std::move(model);
  return out;
}

// Z-Image: every block's q, k, v and out (d x d), SwiGLU's w1 and w3 (d x f) and w2 (f x d), over its own
// rows (the noise refiner: the image's tokens; the context refiner: the caption's; the main layers: both);
// the patch embedding and the final projection. Token runs are padded to multiples of 32, as the model pads
// them.
Workload z_image_workload(const kiln::models::ZImageTransformerConfig& c, int64_t n, int64_t l) {
  const auto pad = [](int64_t x) { return (x + 31) / 32 * 32; };
  const int64_t d = c.dim, f = c.ffn_hidden(), np = pad(n), lp = pad(l), s = np + lp;
  Workload w;
  w.linears = {{n, c.patch_features(), d, 1}, {l, c.cap_feat_dim, d, 1}, {n, d, c.patch_features(), 1}};
  for (const auto& [rows, blocks] :
       {std::pair{np, c.n_refiner_layers}, {lp, c.n_refiner_layers}, {s, c.n_layers}})
    w.linears.insert(w.linears.end(),
                     {{rows, d, d, 4 * blocks}, {rows, d, f, 2 * blocks}, {rows, f, d, blocks}});
  w.attention_flops =
      4.0 * d *
      (static_cast<double>(np) * np * c.n_refiner_layers + static_cast<double>(lp) * lp * c.n_refiner_layers +
       static_cast<double>(s) * s * c.n_layers);
  return w;
}

Case z_image_case(const Options& o, const InputFile& in) {
  using kiln::bfloat16;
  std::unique_ptr<kiln::models::ZImageTransformer2DModel> model;
  kiln::Tensor latents, t, caption;
  if (o.random) {
    kiln::models::ZImageTransformerConfig c;  // diffusers' defaults are Z-Image's widths
    c.n_layers = o.layers > 0 ? o.layers : 2;
    c.n_refiner_layers = 1;
    if (o.tiny) {
      c.dim = 64;
      c.n_heads = c.n_kv_heads = 2;
      c.axes_dims = {8, 12, 12};
      c.cap_feat_dim = 48;
    }
    model = std::make_unique<kiln::models::ZImageTransformer2DModel>(c);
    kiln::nn::LoadOptions load;
    load.dtype = bfloat16;
    model->load_weights(kiln::bench::RandomWeights(*model, bfloat16), load);
    kiln::Generator gen(0);
    latents = kiln::bench::random({1, c.in_channels, o.size / 8, o.size / 8}, bfloat16, gen, 1.0);
    caption = kiln::bench::random({o.tiny ? 8 : 160, c.cap_feat_dim}, bfloat16, gen, 1.0);
    t = kiln::Tensor::full({1}, 0.0, kiln::float32);
  } else {
    model = kiln::models::load_z_image_transformer(o.checkpoint, bfloat16);
    latents = in.get("x").select(1, 0).unsqueeze(0);  // [C, 1, H, W] -> [1, C, H, W]
    caption = in.get("cap_feats");
    t = in.get("t");
  }
  const auto& c = model->config();
  Case out;
  const int64_t h = latents.shape()[2], w = latents.shape()[3];
  out.work = z_image_workload(c, (h / 2) * (w / 2), caption.shape()[0]);
  std::ostringstream d;
  d << "zimage " << c.n_refiner_layers << "+" << c.n_refiner_layers << "+" << c.n_layers << " blocks, width "
    << c.dim << ", " << (h / 2) * (w / 2) << " image + " << caption.shape()[0] << " caption tokens";
  out.work.description = d.str();
  auto* m = model.get();
  // PyTorch's output is the one image's [C, 1, H, W].
  out.step = [=] { return m->forward(latents, t, {caption}).view({c.in_channels, 1, h, w}); };
  out.model = std::move(model);
  return out;
}

// Qwen-Image: every dual-stream block's image and text streams each have q, k, v and an output projection
// (d x d) and a GELU feed-forward (d x 4d, 4d x d) over their own rows, and one joint attention over both;
// img_in, txt_in and proj_out. The modulations (d x 6d per stream) act on one row and are left out.
Workload qwen_image_workload(const kiln::models::QwenImageTransformerConfig& c, int64_t batch, int64_t n,
                             int64_t l) {
  const int64_t d = c.inner_dim(), f = 4 * d, s = n + l, b = batch, k = c.num_layers;
  const int64_t out = c.patch_size * c.patch_size * c.out_channels;
  Workload w;
  w.linears = {{b * n, c.in_channels, d, 1}, {b * l, c.joint_attention_dim, d, 1}, {b * n, d, out, 1}};
  for (const int64_t rows : {b * n, b * l})
    w.linears.insert(w.linears.end(), {{rows, d, d, 4 * k}, {rows, d, f, k}, {rows, f, d, k}});
  w.attention_flops = 4.0 * b * s * s * d * k;
  return w;
}

Case qwen_image_case(const Options& o, const InputFile& in) {
  using kiln::bfloat16;
  std::unique_ptr<kiln::models::QwenImageTransformer2DModel> model;
  kiln::Tensor hidden, text, t;
  int64_t grid = o.size / 16;
  if (o.random) {
    kiln::models::QwenImageTransformerConfig c;  // diffusers' defaults are Qwen-Image's widths
    c.num_layers = o.layers > 0 ? o.layers : 2;
    if (o.tiny) {
      c.num_attention_heads = 2;
      c.attention_head_dim = 32;
      c.axes_dims_rope = {8, 12, 12};
      c.joint_attention_dim = 48;
    }
    model = std::make_unique<kiln::models::QwenImageTransformer2DModel>(c);
    kiln::nn::LoadOptions load;
    load.dtype = bfloat16;
    model->load_weights(kiln::bench::RandomWeights(*model, bfloat16), load);
    kiln::Generator gen(0);
    hidden = kiln::bench::random({1, grid * grid, c.in_channels}, bfloat16, gen, 1.0);
    text = kiln::bench::random({1, o.tiny ? 8 : 200, c.joint_attention_dim}, bfloat16, gen, 1.0);
    t = kiln::Tensor::full({1}, 1.0, bfloat16);
  } else {
    model = kiln::models::load_qwen_image_transformer(o.checkpoint, bfloat16);
    hidden = in.get("hidden_states");
    text = in.get("encoder_hidden_states");
    t = in.get("timestep");
    grid = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(hidden.shape()[1]))));
    KILN_CHECK(grid * grid == hidden.shape()[1],
               "bench_compare_driver: qwenimage's inputs must be a square "
               "grid of patches, got "
                   << hidden.shape()[1] << " image tokens");
  }
  const auto& c = model->config();
  const int64_t n = hidden.shape()[1], l = text.shape()[1];
  Case out;
  out.work = qwen_image_workload(c, hidden.shape()[0], n, l);
  std::ostringstream d;
  d << "qwenimage " << c.num_layers << " blocks, width " << c.inner_dim() << ", " << n << " image + " << l
    << " text tokens, one call";
  if (c.inner_dim() == 3072 && c.num_layers != 60) {
    auto full = c;
    full.num_layers = 60;
    const Workload real = qwen_image_workload(full, hidden.shape()[0], n, l);
    out.full_depth_flops = real.linear_flops() + real.attention_flops;
    d << " (cut from Qwen-Image's 60)";
  }
  out.work.description = d.str();
  auto* m = model.get();
  const std::vector<kiln::models::QwenImageShape> shapes = {{.frames = 1, .height = grid, .width = grid}};
  out.step = [=] { return m->forward(hidden, text, kiln::Tensor(), t, shapes); };
  out.model = std::move(model);
  return out;
}

// UNet2DConditionModel (diffusers' block layout, the one the SD 1.x/2.x and SDXL checkpoints use). Its
// convolutions count as the matmuls they are: a k x k convolution from cin to cout channels over P output
// pixels is a Linear of P rows, k k cin inputs and cout outputs. Per level of the down path: ResNet blocks
// (conv1, conv2, a 1x1 shortcut where the width changes), in the CrossAttn levels a spatial transformer after
// each (proj_in, BasicTransformerBlocks, proj_out), then a stride-2 convolution except at the last level; the
// middle block: ResNet, transformer, ResNet; the up path, deepest level first: one ResNet more per level,
// each taking the skip concatenated (so always a shortcut), its transformers, then a convolution at twice the
// size except at the top. A BasicTransformerBlock over S pixels of width C with L text tokens:
// self-attention's q, k, v and out (C x C on S rows), cross-attention's q and out (S rows) and k and v
// (cross_dim x C on L rows), GEGLU's C x 8C and 4C x C; attention 4 S^2 C (self) + 4 S L C (cross). The time
// embedding, SDXL's added embedding and each ResNet's time projection act on one row per batch element and
// are left out.
Workload unet_workload(const kiln::models::UNet2DConditionConfig& c, int64_t batch, int64_t height,
                       int64_t width, int64_t text) {
  Workload w;
  const int64_t b = batch, l = text, levels = static_cast<int64_t>(c.block_out_channels.size());
  auto conv = [&](int64_t pixels, int64_t cin, int64_t cout, int64_t kernel) {
    w.linears.push_back({b * pixels, kernel * kernel * cin, cout, 1});
  };
  auto resnet = [&](int64_t pixels, int64_t cin, int64_t cout) {
    conv(pixels, cin, cout, 3);
    conv(pixels, cout, cout, 3);
    if (cin != cout) conv(pixels, cin, cout, 1);
  };
  auto transformer = [&](int64_t pixels, int64_t ch, int64_t blocks) {
    const int64_t s = b * pixels, t = b * l;
    w.linears.insert(w.linears.end(), {{s, ch, ch, 2},  // proj_in, proj_out (Linear or 1x1 conv)
                                       {s, ch, ch, 6 * blocks},
                                       {t, c.cross_attention_dim, ch, 2 * blocks},
                                       {s, ch, 8 * ch, blocks},
                                       {s, 4 * ch, ch, blocks}});
    w.attention_flops += 4.0 * b * blocks * ch * (static_cast<double>(pixels) * pixels + pixels * l);
  };
  // Each level's pixels (a stride-2 convolution padded by 1 gives ceil(n / 2)).
  std::vector<int64_t> pixels;
  for (int64_t i = 0, h = height, x = width; i < levels; ++i, h = (h + 1) / 2, x = (x + 1) / 2)
    pixels.push_back(h * x);
  const auto& ch = c.block_out_channels;
  conv(pixels[0], c.in_channels, ch[0], 3);
  for (int64_t i = 0; i < levels; ++i) {
    const bool attention = c.down_block_types[i] == "CrossAttnDownBlock2D";
    for (int64_t j = 0; j < c.layers_per_block[i]; ++j) {
      resnet(pixels[i], j == 0 ? ch[std::max<int64_t>(i - 1, 0)] : ch[i], ch[i]);
      if (attention) transformer(pixels[i], ch[i], c.transformer_layers_per_block[i]);
    }
    if (i + 1 < levels) conv(pixels[i + 1], ch[i], ch[i], 3);
  }
  resnet(pixels.back(), ch.back(), ch.back());
  transformer(pixels.back(), ch.back(), c.transformer_layers_per_block.back());
  resnet(pixels.back(), ch.back(), ch.back());
  int64_t previous = ch.back();
  for (int64_t u = 0; u < levels; ++u) {
    const int64_t level = levels - 1 - u, out = ch[level], input = ch[std::max<int64_t>(level - 1, 0)];
    const int64_t n = c.layers_per_block[level] + 1;
    const bool attention = c.up_block_types[u] == "CrossAttnUpBlock2D";
    for (int64_t j = 0; j < n; ++j) {
      const int64_t skip = j == n - 1 ? input : out;
      resnet(pixels[level], (j == 0 ? previous : out) + skip, out);
      if (attention) transformer(pixels[level], out, c.transformer_layers_per_block[level]);
    }
    if (level > 0) conv(pixels[level - 1], out, out, 3);
    previous = out;
  }
  conv(pixels[0], ch[0], c.out_channels, 3);
  return w;
}

// The configs of the real checkpoints' unet/config.json (runwayml/stable-diffusion-v1-5,
// stabilityai/stable-diffusion-xl-base-1.0); SDXL's deepest level and middle block cut to `layers`
// transformer blocks (the real model: 10).
kiln::models::UNet2DConditionConfig sd15_unet_config(bool tiny) {
  kiln::models::UNet2DConditionConfig c;  // diffusers' defaults are SD1.5's blocks
  c.layers_per_block = {2, 2, 2, 2};
  c.transformer_layers_per_block = {1, 1, 1, 1};
  c.num_attention_heads = {8, 8, 8, 8};
  c.cross_attention_dim = 768;
  if (tiny) {
    c.block_out_channels = {32, 64, 64, 64};
    c.norm_num_groups = 8;
    c.num_attention_heads = {2, 2, 2, 2};
    c.cross_attention_dim = 32;
  }
  return c;
}

kiln::models::UNet2DConditionConfig sdxl_unet_config(int64_t layers, bool tiny) {
  kiln::models::UNet2DConditionConfig c;
  c.sample_size = 128;
  c.down_block_types = {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"};
  c.up_block_types = {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"};
  c.block_out_channels = {320, 640, 1280};
  c.layers_per_block = {2, 2, 2};
  c.transformer_layers_per_block = {1, 2, layers};
  c.num_attention_heads = {5, 10, 20};
  c.cross_attention_dim = 2048;
  c.use_linear_projection = true;
  c.addition_embed_type = "text_time";
  c.addition_time_embed_dim = 256;
  c.projection_class_embeddings_input_dim = 2816;  // the pooled 1280 + 6 time ids x 256
  if (tiny) {
    c.block_out_channels = {32, 64, 64};
    c.norm_num_groups = 8;
    c.num_attention_heads = {2, 2, 4};
    c.cross_attention_dim = 64;
    c.addition_time_embed_dim = 8;
    c.projection_class_embeddings_input_dim = 32 + 6 * 8;
  }
  return c;
}

Case unet_case(const Options& o, const InputFile& in) {
  using kiln::bfloat16;
  const bool xl = o.model == "sdxl";
  std::unique_ptr<kiln::models::UNet2DConditionModel> model;
  kiln::Tensor sample, t, text;
  kiln::models::UNetAddedConditions added;
  if (o.random) {
    const auto c = xl ? sdxl_unet_config(o.layers > 0 ? o.layers : 2, o.tiny) : sd15_unet_config(o.tiny);
    model = std::make_unique<kiln::models::UNet2DConditionModel>(c);
    kiln::nn::LoadOptions load;
    load.dtype = bfloat16;
    model->load_weights(kiln::bench::RandomWeights(*model, bfloat16), load);
    // Classifier-free guidance as one batch of 2, 77 CLIP tokens.
    const int64_t b = 2, l = o.tiny ? 8 : 77, h = o.size / 8;
    kiln::Generator gen(0);
    sample = kiln::bench::random({b, c.in_channels, h, h}, bfloat16, gen, 1.0);
    text = kiln::bench::random({b, l, c.cross_attention_dim}, bfloat16, gen, 1.0);
    t = kiln::Tensor::full({b}, 999.0, kiln::float32);
    if (xl) {
      const int64_t pooled = c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim;
      added.text_embeds = kiln::bench::random({b, pooled}, bfloat16, gen, 1.0);
      const auto px = static_cast<float>(o.size);
      added.time_ids =
          kiln::Tensor::from_vector(std::vector<float>{px, px, 0, 0, px, px, px, px, 0, 0, px, px}, {b, 6});
    }
  } else {
    model = kiln::models::load_unet_2d_condition(o.checkpoint, bfloat16);
    sample = in.get("sample");
    t = in.get("timestep").to(kiln::float32);
    text = in.get("encoder_hidden_states");
    if (xl) {
      added.text_embeds = in.get("text_embeds");
      added.time_ids = in.get("time_ids").to(kiln::float32);  // sizes, exact in bf16
    }
  }
  const auto& c = model->config();
  KILN_CHECK(c.text_time() == xl, "bench_compare_driver: --model " << o.model << " but the checkpoint's UNet "
                                                                   << (xl ? "has no" : "has")
                                                                   << " SDXL added conditions");
  const int64_t b = sample.shape()[0], h = sample.shape()[2], w = sample.shape()[3], l = text.shape()[1];
  Case out;
  out.work = unet_workload(c, b, h, w, l);
  std::ostringstream d;
  d << o.model << " UNet, widths";
  for (const int64_t ch : c.block_out_channels) d << " " << ch;
  d << ", transformer blocks";
  for (const int64_t n : c.transformer_layers_per_block) d << " " << n;
  d << ", batch " << b << " x (" << h << "x" << w << " latent + " << l << " text tokens)";
  const bool real_widths = c.block_out_channels == std::vector<int64_t>{320, 640, 1280};
  if (xl && real_widths && c.transformer_layers_per_block.back() != 10) {
    auto full = c;
    full.transformer_layers_per_block.back() = 10;
    const Workload real = unet_workload(full, b, h, w, l);
    out.full_depth_flops = real.linear_flops() + real.attention_flops;
    d << " (cut from SDXL's 10)";
  }
  out.work.description = d.str();
  auto* m = model.get();
  out.step = [=] { return m->forward(sample, t, text, added); };
  out.model = std::move(model);
  return out;
}

// max |a - e| / max |e|, in float32.
double max_rel_error(const kiln::Tensor& a, const kiln::Tensor& e) {
  KILN_CHECK(a.shape() == e.shape(), "bench_compare_driver: output " << kiln::shape_str(a.shape())
                                                                     << " but the expected output is "
                                                                     << kiln::shape_str(e.shape()));
  const auto x = a.to_vector<float>(), y = e.to_vector<float>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) return INFINITY;  // std::max would skip a NaN
    diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(y[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

std::string json_number(double v) {
  if (std::isnan(v)) return "null";
  if (std::isinf(v)) return "1e999";  // json.loads reads it as inf
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

int run(const Options& o) {
  InputFile in;
  if (!o.random) {
    if (o.inputs.empty()) usage("--checkpoint needs --inputs FILE (written by compare.py)");
    in.file = std::make_unique<kiln::io::SafetensorsFile>(o.inputs);
  }
  Case c = o.model == "flux"        ? flux_case(o, in)
           : o.model == "flux2"     ? flux2_case(o, in)
           : o.model == "sd3"       ? sd3_case(o, in)
           : o.model == "zimage"    ? z_image_case(o, in)
           : o.model == "qwenimage" ? qwen_image_case(o, in)
           : o.model == "t5"        ? t5_case(o, in)
                                    : unet_case(o, in);
  c.expected = in.expected();
  const double weight_bytes = static_cast<double>(c.model->parameter_bytes(kiln::bfloat16));

  // Compiled modes trace the forward at its first call (the warm-up below), for these input shapes.
  if (o.mode == "compile") c.model->compile(kiln::nn::CompileOptions{});
  if (o.mode == "compile-blocks") c.model->compile_repeated_blocks();
  if (o.mode == "fuse") kiln::set_eager_mode(kiln::EagerMode::DeferAndFuse);
  kiln::Tensor output;
  const Timing step = time_steps(o.steps, [&] { output = c.step(); });
  const double rel_error = c.expected ? max_rel_error(output, *c.expected) : NAN;
  const double resident = peak_resident_bytes();
  kiln::set_eager_mode(kiln::EagerMode::DeferNever);

  const kiln::bench::Bf16Ceiling ceiling = kiln::bench::measure_bf16_ceiling();
  kiln::bench::print_ceiling(ceiling);
  const double peak = ceiling.gflops;
  const double matmul = o.matmul_reps > 0 ? matmul_seconds(c.work, o.matmul_reps) : NAN;
  const double flops = c.work.linear_flops() + c.work.attention_flops;
  const double gflops = flops / step.median / 1e9;

  std::printf("kiln %-7s %s, bf16, %d threads\n", o.mode.c_str(), c.work.description.c_str(),
              omp_get_max_threads());
  std::printf(
      "  step %.3f s median (%.3f-%.3f, %d runs) | %.1f GFLOP, %.1f GFLOP/s = %.1f%% of the measured bf16 "
      "ceiling %.0f (%s)\n",
      step.median, step.min, step.max, o.steps, flops / 1e9, gflops, peak > 0 ? 100 * gflops / peak : NAN,
      peak, ceiling.instruction);
  std::printf("  first call %.3f s (warm-up%s) | cores busy %.2f of %d (process CPU time / wall)\n",
              step.first, o.mode.rfind("compile", 0) == 0 ? ", tracing and compiling included" : "",
              step.cores_busy, omp_get_max_threads());
  if (!std::isnan(c.full_depth_flops))
    std::printf("  at the real depth: %.1f GFLOP per step (%.2fx this cut)\n", c.full_depth_flops / 1e9,
                c.full_depth_flops / flops);
  if (o.matmul_reps > 0)
    std::printf("  matmuls alone %.3f s = %.0f%% of the step (%.1f GFLOP/s)\n", matmul,
                100 * matmul / step.median, c.work.linear_flops() / matmul / 1e9);
  const kiln::MemoryStats memory = kiln::memory_stats(kiln::cpu);
  std::printf(
      "  peak resident %.2f GB (weights %.2f GB); CPU allocator: live peak %.2f GB, %.2f GB reserved, "
      "%.1f fresh allocations per step",
      resident / 1e9, weight_bytes / 1e9, static_cast<double>(memory.peak_bytes) / 1e9,
      static_cast<double>(memory.reserved_bytes) / 1e9, step.fresh_allocations);
  if (c.expected)
    std::printf(" | max rel error vs PyTorch %.3g\n", rel_error);
  else
    std::printf(" | no PyTorch output to compare with\n");
  std::printf(
      "KILN_RESULT {\"engine\": \"kiln\", \"mode\": \"%s\", \"model\": \"%s\", \"case\": \"%s\", "
      "\"threads\": %d, "
      "\"steps\": %d, \"median_s\": %s, \"min_s\": %s, \"max_s\": %s, \"first_call_s\": %s, \"flops\": %s, "
      "\"linear_flops\": %s, "
      "\"measured_peak_gflops\": %s, \"peak_instruction\": \"%s\", \"bf16_path\": \"%s\", \"matmul_s\": %s, "
      "\"vmhwm_bytes\": %s, "
      "\"weight_bytes\": %s, "
      "\"max_rel_error\": %s, \"cores_busy\": %s, \"fresh_allocations_per_step\": %s, "
      "\"full_depth_flops\": %s}\n",
      o.mode.c_str(), o.model.c_str(), c.work.description.c_str(), omp_get_max_threads(), o.steps,
      json_number(step.median).c_str(), json_number(step.min).c_str(), json_number(step.max).c_str(),
      json_number(step.first).c_str(), json_number(flops).c_str(), json_number(c.work.linear_flops()).c_str(),
      json_number(peak).c_str(), ceiling.instruction,
      kiln::cpu_kernels::bf16_path_name(kiln::cpu_kernels::bf16_path()), json_number(matmul).c_str(),
      json_number(resident).c_str(), json_number(weight_bytes).c_str(), json_number(rel_error).c_str(),
      json_number(step.cores_busy).c_str(), json_number(step.fresh_allocations).c_str(),
      json_number(c.full_depth_flops).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_compare_driver: %s\n", e.what());
    return 1;
  }
}
