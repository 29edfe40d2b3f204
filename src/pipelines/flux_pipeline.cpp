#include "kiln/pipelines/flux_pipeline.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "kiln/core/device_runtime.h"
#include "kiln/core/log.h"
#include "kiln/io/model_index.h"
#include "kiln/io/model_ref.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/t5_encoder.h"
#include "kiln/ops.h"
#include "kiln/schedulers/flow_match_euler.h"
#include "kiln/schedulers/timestep_shift.h"
#include "kiln/tokenizers/clip_tokenizer.h"
#include "kiln/tokenizers/t5_tokenizer.h"
#include "pipelines/model_offload.h"

namespace kiln {

namespace fs = std::filesystem;

FluxPipeline::FluxPipeline() = default;
FluxPipeline::FluxPipeline(FluxPipeline&&) noexcept = default;
FluxPipeline& FluxPipeline::operator=(FluxPipeline&&) noexcept = default;
FluxPipeline::~FluxPipeline() = default;

FluxPipeline FluxPipeline::from_pretrained(const std::string& model, const PipelineLoadOptions& options) {
  KILN_CHECK(
      options.dtype == float32 || options.dtype == bfloat16 || options.dtype == float16,
      "FluxPipeline: dtype " << dtype_name(options.dtype) << " is not supported (expected f32, bf16 or f16)");
  io::ResolveOptions resolve;
  resolve.revision = options.revision;
  const io::ResolvedModel resolved = io::resolve_model(model, resolve);
  const io::ModelIndex index = io::load_model_index(resolved.path);
  KILN_CHECK(index.class_name == "FluxPipeline",
             index.path << ": pipeline class is '" << index.class_name << "', but this is FluxPipeline");
  auto need = [&](const char* name, const char* cls) {
    const io::PipelineComponent* c = index.find(name);
    KILN_CHECK(c != nullptr && c->present(), index.path << ": component '" << name << "' is missing");
    KILN_CHECK(c->class_name == cls ||
                   (std::string(cls) == "T5TokenizerFast" && c->class_name == "T5Tokenizer") ||
                   (std::string(cls) == "CLIPTokenizer" && c->class_name == "CLIPTokenizerFast"),
               index.path << ": component '" << name << "' is a " << c->class_name << ", expected " << cls);
    const std::string dir = (fs::path(resolved.path) / name).string();
    KILN_CHECK(fs::is_directory(dir), index.path << ": component folder '" << dir << "' does not exist");
    return dir;
  };
  FluxPipeline pipe;
  pipe.path_ = resolved.path;
  pipe.name_ = model;
  pipe.dtype_ = options.dtype;
  const int count = 7;
  int loaded = 0;
  auto done = [&](const char* name) {
    if (options.on_component_loaded) options.on_component_loaded(name, ++loaded, count);
  };
  pipe.scheduler_ = std::make_unique<FlowMatchEulerDiscreteScheduler>(
      FlowMatchEulerDiscreteScheduler::from_pretrained(need("scheduler", "FlowMatchEulerDiscreteScheduler")));
  done("scheduler");
  pipe.tokenizer_ = std::make_unique<tokenizers::ClipTokenizer>(
      tokenizers::ClipTokenizer::from_directory(need("tokenizer", "CLIPTokenizer")));
  done("tokenizer");
  pipe.tokenizer_2_ = std::make_unique<tokenizers::T5Tokenizer>(
      tokenizers::T5Tokenizer::from_directory(need("tokenizer_2", "T5TokenizerFast")));
  done("tokenizer_2");
  pipe.text_encoder_ = models::load_clip_text_model(need("text_encoder", "CLIPTextModel"), options.dtype);
  done("text_encoder");
  const std::vector<std::string> splittable = {"transformer", "text_encoder_2"};
  pipe.text_encoder_2_ = models::load_t5_encoder(need("text_encoder_2", "T5EncoderModel"), options.dtype,
                                                 options.tensor_parallel_for("text_encoder_2", splittable));
  done("text_encoder_2");
  if (options.transformer_file.empty()) {
    pipe.transformer_ =
        models::load_flux_transformer(need("transformer", "FluxTransformer2DModel"), options.dtype,
                                      options.tensor_parallel_for("transformer", splittable));
  } else {
    KILN_CHECK(options.parallel_config.count("transformer") == 0,
               "FluxPipeline: a single-file transformer cannot be split across ranks yet; load it without "
               "tensor parallelism or from a diffusers folder");
    const fs::path config = fs::path(resolved.path) / "transformer" / "config.json";
    pipe.transformer_ = models::FluxTransformer2DModel::from_single_file(
        options.transformer_file,
        {.config = fs::is_regular_file(config) ? config.string() : "", .dtype = options.dtype});
  }
  done("transformer");
  pipe.vae_ = models::load_autoencoder_kl(need("vae", "AutoencoderKL"), options.dtype);
  done("vae");
  pipe.weight_packing_ =
      apply_weight_packing(static_cast<int64_t>(pipe.text_encoder_->parameter_bytes(options.dtype) +
                                                pipe.text_encoder_2_->parameter_bytes(options.dtype) +
                                                pipe.transformer_->parameter_bytes(options.dtype) +
                                                pipe.vae_->parameter_bytes(options.dtype)),
                           options.packed_weight_budget);
  const auto& tc = pipe.transformer_->config();
  KILN_CHECK(tc.joint_attention_dim == pipe.text_encoder_2_->config().d_model,
             pipe.path_ << ": transformer joint_attention_dim " << tc.joint_attention_dim
                        << " does not match text_encoder_2 d_model "
                        << pipe.text_encoder_2_->config().d_model);
  KILN_CHECK(tc.pooled_projection_dim == pipe.text_encoder_->config().hidden_size,
             pipe.path_ << ": transformer pooled_projection_dim " << tc.pooled_projection_dim
                        << " does not match text_encoder hidden_size "
                        << pipe.text_encoder_->config().hidden_size);
  KILN_CHECK(tc.in_channels == 4 * pipe.vae_->config().latent_channels,
             pipe.path_ << ": transformer in_channels " << tc.in_channels
                        << " is not 4 x vae latent_channels " << pipe.vae_->config().latent_channels);
  return pipe;
}

FluxPipeline::PromptEmbeddings FluxPipeline::encode_prompt(const std::string& prompt,
                                                           const std::optional<std::string>& prompt_2,
                                                           int num_images_per_prompt,
                                                           int64_t max_sequence_length) const {
  PromptEmbeddings out;
  // CLIP: only its pooled vector is used. 77 tokens at most (the tokenizer's model_max_length).
  const int64_t clip_max = tokenizer_->model_max_length();
  if (static_cast<int64_t>(tokenizer_->tokenize(prompt).size()) + 2 > clip_max)
    warn("the prompt is longer than CLIP's " + std::to_string(clip_max) +
         " tokens and was truncated for CLIP");
  tokenizers::EncodeOptions clip_options;
  clip_options.max_length = clip_max;
  out.clip_ids = tokenizer_->encode(prompt, clip_options).ids;
  const Tensor clip_ids = Tensor::from_vector(out.clip_ids, {1, static_cast<int64_t>(out.clip_ids.size())});
  Tensor pooled = text_encoder_->forward(clip_ids).pooled;

  const std::string& t5_prompt = prompt_2 ? *prompt_2 : prompt;
  if (static_cast<int64_t>(tokenizer_2_->tokenize(t5_prompt).size()) + 1 > max_sequence_length)
    warn("the prompt is longer than max_sequence_length (" + std::to_string(max_sequence_length) +
         " tokens) and was truncated");
  tokenizers::EncodeOptions t5_options;
  t5_options.max_length = max_sequence_length;
  out.t5_ids = tokenizer_2_->encode(t5_prompt, t5_options).ids;
  const Tensor t5_ids = Tensor::from_vector(out.t5_ids, {1, static_cast<int64_t>(out.t5_ids.size())});
  Tensor embeds = text_encoder_2_->forward(t5_ids);

  if (num_images_per_prompt > 1) {
    pooled = pooled.expand({num_images_per_prompt, pooled.size(1)}).contiguous();
    embeds = embeds.expand({num_images_per_prompt, embeds.size(1), embeds.size(2)}).contiguous();
  }
  out.pooled_prompt_embeds = pooled;
  out.prompt_embeds = embeds;
  out.text_ids = models::flux_text_ids(embeds.size(1), embeds.dtype());
  return out;
}

std::pair<Tensor, Tensor> FluxPipeline::prepare_latents(int64_t batch, int64_t height, int64_t width,
                                                        DType dtype, Generator& generator) const {
  const int64_t f = vae_->config().scale_factor();
  const int64_t h = 2 * (height / (f * 2)), w = 2 * (width / (f * 2));
  const int64_t c = transformer_->config().in_channels / 4;
  const Tensor noise = randn_tensor({batch, c, h, w}, generator, dtype);
  // 2x2 patches: [B, C, h/2, 2, w/2, 2] -> [B, h/2, w/2, C, 2, 2] -> [B, (h/2)(w/2), 4C]
  const Tensor packed = noise.view({batch, c, h / 2, 2, w / 2, 2})
                            .permute({0, 2, 4, 1, 3, 5})
                            .reshape({batch, (h / 2) * (w / 2), c * 4});
  return {packed, models::flux_latent_image_ids(h / 2, w / 2, dtype)};
}

Tensor FluxPipeline::decode_latents(const Tensor& latents, int64_t height, int64_t width) const {
  const int64_t f = vae_->config().scale_factor();
  const int64_t B = latents.size(0), C = latents.size(2);
  const int64_t h = 2 * (height / (f * 2)), w = 2 * (width / (f * 2));
  const Tensor unpacked =
      latents.view({B, h / 2, w / 2, C / 4, 2, 2}).permute({0, 3, 1, 4, 2, 5}).reshape({B, C / 4, h, w});
  const auto& vc = vae_->config();
  // diffusers: latents / scaling_factor + shift_factor, in the latents' dtype.
  const Tensor z = add(div(unpacked, vc.scaling_factor), vc.shift_factor);
  const Tensor image = vae_->decode(z);
  // VaeImageProcessor.postprocess: (x * 0.5 + 0.5).clamp(0, 1) in the tensor's dtype, then NHWC float32.
  const Tensor denorm = clamp(add(mul(image, 0.5), 0.5), 0.0, 1.0);
  return denorm.permute({0, 2, 3, 1}).to(float32).contiguous();
}

void FluxPipeline::check_call(const FluxPipelineCall& call) const {
  const int64_t multiple = vae_->config().scale_factor() * 2;
  KILN_CHECK(call.height > 0 && call.width > 0 && call.height % multiple == 0 && call.width % multiple == 0,
             "FluxPipeline: height and width must be positive multiples of "
                 << multiple << ", got " << call.height << "x" << call.width);
  KILN_CHECK(
      call.num_inference_steps >= 1 && call.num_inference_steps <= 1000,
      "FluxPipeline: num_inference_steps must be between 1 and 1000, got " << call.num_inference_steps);
  KILN_CHECK(call.max_sequence_length >= 1 && call.max_sequence_length <= 512,
             "FluxPipeline: max_sequence_length must be between 1 and 512, got " << call.max_sequence_length);
  KILN_CHECK(
      call.num_images_per_prompt >= 1 && call.num_images_per_prompt <= 64,
      "FluxPipeline: num_images_per_prompt must be between 1 and 64, got " << call.num_images_per_prompt);
  KILN_CHECK(std::isfinite(call.guidance_scale) && call.guidance_scale >= 0,
             "FluxPipeline: guidance_scale must be a finite value >= 0, got " << call.guidance_scale);
}

PipelineOutput FluxPipeline::operator()(const FluxPipelineCall& call) {
  check_call(call);
  const PromptEmbeddings prompt =
      encode_prompt(call.prompt, call.prompt_2, call.num_images_per_prompt, call.max_sequence_length);
  if (model_cpu_offload_)
    pipelines::release_after_use(
        {{"text_encoder", text_encoder_.get()}, {"text_encoder_2", text_encoder_2_.get()}});
  Generator generator = call.generator ? *call.generator : Generator();
  const uint64_t seed = generator.initial_seed();
  const int64_t batch = call.num_images_per_prompt;
  auto [latents, image_ids] =
      prepare_latents(batch, call.height, call.width, prompt.prompt_embeds.dtype(), generator);

  const int64_t image_seq_len = latents.size(1);
  const auto& sc = scheduler_->config();
  const double mu = calculate_shift(image_seq_len, sc.base_image_seq_len, sc.max_image_seq_len,
                                    sc.base_shift.value_or(0.5), sc.max_shift.value_or(1.15));
  scheduler_->set_timesteps(call.num_inference_steps, flux_sigmas(call.num_inference_steps), mu);
  Tensor guidance;
  if (transformer_->config().guidance_embeds)
    guidance = Tensor::full({batch}, static_cast<double>(call.guidance_scale), float32);

  const auto& timesteps = scheduler_->timesteps();
  for (size_t i = 0; i < timesteps.size(); ++i) {
    const auto start = std::chrono::steady_clock::now();
    // diffusers: t.expand(B).to(latents.dtype) / 1000, in the latents' dtype.
    const Tensor t = div(Tensor::full({batch}, timesteps[i], float32).to(latents.dtype()), 1000.0);
    const Tensor velocity = transformer_->forward(latents, prompt.prompt_embeds, prompt.pooled_prompt_embeds,
                                                  t, guidance, prompt.text_ids, image_ids);
    latents = scheduler_->step(velocity, static_cast<int>(i), latents);
    synchronize(latents.device());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (call.on_step_end) call.on_step_end(static_cast<int>(i), static_cast<int>(timesteps.size()), seconds);
  }

  if (model_cpu_offload_) pipelines::release_after_use({{"transformer", transformer_.get()}});
  const Tensor images = decode_latents(latents, call.height, call.width);
  if (model_cpu_offload_) pipelines::release_after_use({{"vae", vae_.get()}});
  PipelineOutput out;
  for (int64_t b = 0; b < batch; ++b) {
    Image image = Image::from_float(images.select(0, b));
    image.metadata = {{"prompt", call.prompt},
                      {"model", name_},
                      {"pipeline", "FluxPipeline"},
                      {"seed", std::to_string(seed)},
                      {"steps", std::to_string(call.num_inference_steps)},
                      {"guidance_scale", std::to_string(call.guidance_scale)},
                      {"height", std::to_string(call.height)},
                      {"width", std::to_string(call.width)},
                      {"max_sequence_length", std::to_string(call.max_sequence_length)},
                      {"dtype", std::string(dtype_name(dtype_))},
                      {"software", "Kiln"}};
    if (call.prompt_2) image.metadata["prompt_2"] = *call.prompt_2;
    out.images.push_back(std::move(image));
  }
  return out;
}

std::vector<std::pair<std::string, nn::Module*>> FluxPipeline::components() const {
  return {{"text_encoder", text_encoder_.get()},
          {"text_encoder_2", text_encoder_2_.get()},
          {"transformer", transformer_.get()},
          {"vae", vae_.get()}};
}

void FluxPipeline::enable_sequential_cpu_offload(int64_t resident_bytes) {
  model_cpu_offload_ = pipelines::apply_offload(
      {.mode = OffloadMode::Sequential, .budget = std::max<int64_t>(resident_bytes, 0)}, components());
}

void FluxPipeline::enable_group_offload(const GroupOffloadOptions& options) {
  model_cpu_offload_ = pipelines::apply_offload({.mode = OffloadMode::Group, .group = options}, components());
}

void FluxPipeline::enable_model_cpu_offload(std::optional<Device> device) {
  const Device on = pipelines::offload_compute_device(device);
  pipelines::clear_offload(weight_packing_);
  model_cpu_offload_ = true;
  if (log_enabled("offload"))
    log("offload", "model offload: each component on " + on.str() + " while it runs");
}

void FluxPipeline::to(const Device& device) {
  device_runtime(device);  // throws, naming the device, when this build has no backend for it
  pipelines::clear_offload(weight_packing_);
  model_cpu_offload_ = false;
  if (log_enabled("offload")) log("offload", "every component resident on " + device.str());
}

OffloadPlan FluxPipeline::set_memory_budget(int64_t bytes) {
  const OffloadPlan plan = plan_offload(components(), bytes);
  model_cpu_offload_ = pipelines::apply_offload(plan, components());
  return plan;
}

void FluxPipeline::enable_vae_tiling(int64_t tile_size) {
  vae_->enable_tiling({.tile_sample_min_size = tile_size});
}

void FluxPipeline::disable_vae_tiling() {
  vae_->disable_tiling();
}

}  // namespace kiln
