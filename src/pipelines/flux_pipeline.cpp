#include "kiln/pipelines/flux_pipeline.h"

#include <filesystem>
#include <tuple>

#include "kiln/core/log.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/t5_encoder.h"
#include "kiln/ops.h"
#include "kiln/schedulers/flow_match_euler.h"
#include "kiln/schedulers/timestep_shift.h"
#include "kiln/tokenizers/clip_tokenizer.h"
#include "kiln/tokenizers/t5_tokenizer.h"
#include "pipelines/call_control.h"
#include "pipelines/denoise.h"
#include "pipelines/pipeline_common.h"

namespace kiln {

namespace fs = std::filesystem;

FluxPipeline::FluxPipeline() = default;
FluxPipeline::FluxPipeline(FluxPipeline&&) noexcept = default;
FluxPipeline& FluxPipeline::operator=(FluxPipeline&&) noexcept = default;
FluxPipeline::~FluxPipeline() = default;

FluxPipeline FluxPipeline::from_pretrained(const std::string& model, const PipelineLoadOptions& options) {
  pipelines::PipelineFolder folder(model, options, "FluxPipeline");
  folder.set_component_count(7);
  auto need = [&](const char* name, const char* cls) {
    // The slow and fast tokenizer classes read the same files.
    if (std::string(cls) == "T5TokenizerFast") return folder.need(name, {cls, "T5Tokenizer"});
    if (std::string(cls) == "CLIPTokenizer") return folder.need(name, {cls, "CLIPTokenizerFast"});
    return folder.need(name, {cls});
  };
  FluxPipeline pipe;
  pipe.path_ = folder.path();
  pipe.name_ = model;
  pipe.dtype_ = options.dtype;
  pipe.make_context(options, model);
  ExecutionScope loading_in(pipe.context());
  auto done = [&](const char* name) { folder.loaded(name); };
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
  const std::vector<std::string> splittable = splittable_components();
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
    const fs::path config = fs::path(folder.path()) / "transformer" / "config.json";
    pipe.transformer_ = models::FluxTransformer2DModel::from_single_file(
        options.transformer_file,
        {.config = fs::is_regular_file(config) ? config.string() : "", .dtype = options.dtype});
  }
  done("transformer");
  pipe.vae_ = models::load_autoencoder_kl(need("vae", "AutoencoderKL"), options.dtype);
  done("vae");
  pipe.finish_loading(options.packed_weight_budget);
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
  return pipelines::postprocess(vae_->decode(z));
}

void FluxPipeline::check_fields(const PipelineRequest& request) {
  using pipelines::refuse;
  refuse(request.negative_prompt || request.negative_prompt_2 || request.negative_prompt_3 ||
             request.negative_prompt_embeds.defined(),
         "negative_prompt",
         "FluxPipeline has no negative prompt (FLUX.1 is guidance-distilled; it runs without classifier-free "
         "guidance)");
  refuse(!request.image.empty(), "image",
         "FluxPipeline takes no reference images (Flux2Pipeline and Flux2KleinPipeline do)");
  refuse(request.prompt_3.has_value(), "prompt_3", "FluxPipeline has two text encoders: prompt and prompt_2");
  refuse(request.prompt_embeds.defined(), "prompt_embeds",
         "FluxPipeline encodes its prompts itself; give prompt (and prompt_2) instead of prompt_embeds");
  refuse(!request.skip_layer_guidance.layers.empty(), "skip_layer_guidance",
         "FluxPipeline has no skip-layer guidance (StableDiffusion3Pipeline does)");
  pipelines::refuse_image_editing("FluxPipeline", request);
}

void FluxPipeline::check_loaded_request(const PipelineRequest& request) const {
  check_fields(request);
  const char* name = "FluxPipeline";
  const pipelines::ResolvedRequest r = pipelines::resolve(request, defaults());
  pipelines::check_image_size(name, r.height, r.width, vae_->config().scale_factor() * 2);
  pipelines::check_steps(name, r.num_inference_steps);
  pipelines::check_prompt_size(name, "prompt", request.prompt);
  if (request.prompt_2) pipelines::check_prompt_size(name, "prompt_2", *request.prompt_2);
  pipelines::check_max_sequence_length(name, r.max_sequence_length);
  pipelines::check_images_per_prompt(name, request.num_images_per_prompt);
  pipelines::check_guidance_scale(name, r.guidance_scale);
}

PipelineOutput FluxPipeline::run(const PipelineRequest& request, const pipelines::CallControl& control) {
  const pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  const PromptEmbeddings prompt = encode_prompt(request.prompt, request.prompt_2,
                                                request.num_images_per_prompt, call.max_sequence_length);
  release_after_use({{"text_encoder", text_encoder_.get()}, {"text_encoder_2", text_encoder_2_.get()}});
  Generator generator = request.generator ? *request.generator : Generator();
  const uint64_t seed = generator.initial_seed();
  const int64_t batch = request.num_images_per_prompt;
  // Named tensors, not a structured binding: the step lambda captures them (clang 14 cannot capture
  // bindings).
  Tensor latents, image_ids;
  std::tie(latents, image_ids) =
      prepare_latents(batch, call.height, call.width, prompt.prompt_embeds.dtype(), generator);

  // The call's own schedule: the pipeline's scheduler is never changed by a call.
  FlowMatchEulerDiscreteScheduler schedule = *scheduler_;
  const int64_t image_seq_len = latents.size(1);
  const auto& sc = schedule.config();
  const double mu = calculate_shift(image_seq_len, sc.base_image_seq_len, sc.max_image_seq_len,
                                    sc.base_shift.value_or(0.5), sc.max_shift.value_or(1.15));
  schedule.set_timesteps(call.num_inference_steps, flux_sigmas(call.num_inference_steps), mu);
  Tensor guidance;
  if (transformer_->config().guidance_embeds)
    guidance = Tensor::full({batch}, static_cast<double>(call.guidance_scale), float32);

  latents = pipelines::denoise(
      latents, {.scheduler = &schedule,
                .model_output =
                    [&](const Tensor& x, int, float timestep) {
                      // diffusers: t.expand(B).to(latents.dtype) / 1000, in the latents' dtype.
                      const Tensor t = div(Tensor::full({batch}, timestep, float32).to(x.dtype()), 1000.0);
                      return transformer_->forward(x, prompt.prompt_embeds, prompt.pooled_prompt_embeds, t,
                                                   guidance, prompt.text_ids, image_ids);
                    },
                .on_step_end = request.callback_on_step_end,
                .checkpoint = [&](const std::string& where) { control.checkpoint(where); }});

  release_after_use({{"transformer", transformer_.get()}});
  if (request.output_type == OutputType::Latent) return {.latents = latents};
  control.checkpoint("before decoding");
  const Tensor images = decode_latents(latents, call.height, call.width);
  release_after_use({{"vae", vae_.get()}});
  auto metadata = pipelines::common_metadata(name_, "FluxPipeline", seed, call.num_inference_steps,
                                             call.guidance_scale, call.height, call.width, dtype_);
  metadata["prompt"] = request.prompt;
  metadata["max_sequence_length"] = std::to_string(call.max_sequence_length);
  if (request.prompt_2) metadata["prompt_2"] = *request.prompt_2;
  return pipelines::make_output(request.output_type, images, metadata);
}

std::vector<std::pair<std::string, nn::Module*>> FluxPipeline::components() const {
  return {{"text_encoder", text_encoder_.get()},
          {"text_encoder_2", text_encoder_2_.get()},
          {"transformer", transformer_.get()},
          {"vae", vae_.get()}};
}

models::AutoencoderKL& FluxPipeline::vae_model() const {
  return *vae_;
}

nn::Module& FluxPipeline::transformer_module() {
  return *transformer_;
}

}  // namespace kiln
