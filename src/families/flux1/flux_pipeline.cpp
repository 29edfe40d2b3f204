#include "kiln/families/flux1/flux_pipeline.h"

#include <cmath>
#include <tuple>

#include "families/family_helpers.h"
#include "kiln/core/limits.h"
#include "kiln/core/log.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/t5_encoder.h"
#include "kiln/ops.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/schedulers/flow_match_euler.h"
#include "kiln/schedulers/timestep_shift.h"
#include "kiln/tokenizers/clip_tokenizer.h"
#include "kiln/tokenizers/t5_tokenizer.h"
#include "pipelines/call_control.h"
#include "pipelines/call_generators.h"
#include "pipelines/denoise.h"
#include "pipelines/encoder_activations.h"
#include "pipelines/image_processor.h"
#include "pipelines/pipeline_common.h"
#include "pipelines/task_stages.h"

namespace kiln {

FluxPipeline::FluxPipeline() = default;
FluxPipeline::FluxPipeline(FluxPipeline&&) noexcept = default;
FluxPipeline& FluxPipeline::operator=(FluxPipeline&&) noexcept = default;
FluxPipeline::~FluxPipeline() = default;
FluxPipeline::FluxPipeline(const FluxPipeline& pipe, SharingComponents)
    : DiffusionPipeline(pipe, SharingComponents{}),
      tokenizer_(pipe.tokenizer_),
      tokenizer_2_(pipe.tokenizer_2_),
      text_encoder_(pipe.text_encoder_),
      text_encoder_2_(pipe.text_encoder_2_),
      transformer_(pipe.transformer_),
      vae_(pipe.vae_),
      scheduler_(pipe.scheduler_) {}

FluxPipeline FluxPipeline::from_pipe(const FluxPipeline& pipe) {
  return FluxPipeline(pipe, SharingComponents{});
}
FluxImg2ImgPipeline FluxImg2ImgPipeline::from_pipe(const FluxPipeline& pipe) {
  return FluxImg2ImgPipeline(pipe, SharingComponents{});
}
FluxInpaintPipeline FluxInpaintPipeline::from_pipe(const FluxPipeline& pipe) {
  return FluxInpaintPipeline(pipe, SharingComponents{});
}

// The pipelines that read the same components as FluxPipeline.
#define KILN_FLUX1_CLASSES "FluxPipeline", "FluxImg2ImgPipeline", "FluxInpaintPipeline"

FluxPipeline FluxPipeline::from_pretrained(const std::string& model, const PipelineLoadOptions& options) {
  FluxPipeline pipe;
  load(pipe, model, options, "FluxPipeline", {KILN_FLUX1_CLASSES});
  return pipe;
}

FluxImg2ImgPipeline FluxImg2ImgPipeline::from_pretrained(const std::string& model,
                                                         const PipelineLoadOptions& options) {
  FluxImg2ImgPipeline pipe;
  load(pipe, model, options, "FluxImg2ImgPipeline", {KILN_FLUX1_CLASSES});
  return pipe;
}

FluxInpaintPipeline FluxInpaintPipeline::from_pretrained(const std::string& model,
                                                         const PipelineLoadOptions& options) {
  FluxInpaintPipeline pipe;
  load(pipe, model, options, "FluxInpaintPipeline", {KILN_FLUX1_CLASSES});
  return pipe;
}

FluxKontextPipeline FluxKontextPipeline::from_pretrained(const std::string& model,
                                                         const PipelineLoadOptions& options) {
  FluxKontextPipeline pipe;
  load(pipe, model, options, "FluxKontextPipeline", {KILN_FLUX1_CLASSES});
  return pipe;
}

FluxFillPipeline FluxFillPipeline::from_pretrained(const std::string& model,
                                                   const PipelineLoadOptions& options) {
  FluxFillPipeline pipe;
  load(pipe, model, options, "FluxFillPipeline", {});
  return pipe;
}

void FluxPipeline::load(FluxPipeline& pipe, const std::string& model, const PipelineLoadOptions& options,
                        const char* pipeline_class, std::initializer_list<const char*> compatible) {
  pipelines::PipelineFolder folder(model, options, pipeline_class, compatible);
  folder.set_component_count(7);
  auto need = [&](const char* name, const char* cls) {
    // The slow and fast tokenizer classes read the same files.
    if (std::string(cls) == "T5TokenizerFast") return folder.need(name, {cls, "T5Tokenizer"});
    if (std::string(cls) == "CLIPTokenizer") return folder.need(name, {cls, "CLIPTokenizerFast"});
    return folder.need(name, {cls});
  };
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
  const std::vector<std::string>& splittable = find_pipeline_class(pipeline_class)->splittable_components;
  pipe.text_encoder_2_ = models::load_t5_encoder(need("text_encoder_2", "T5EncoderModel"), options.dtype,
                                                 options.tensor_parallel_for("text_encoder_2", splittable));
  done("text_encoder_2");
  if (options.transformer_file.empty()) {
    pipe.transformer_ =
        models::load_flux_transformer(need("transformer", "FluxTransformer2DModel"), options.dtype,
                                      options.tensor_parallel_for("transformer", splittable));
  } else {
    pipe.transformer_ = models::FluxTransformer2DModel::from_single_file(
        options.transformer_file,
        {.config = single_file_transformer_config(folder.path(), options, pipeline_class),
         .dtype = options.dtype});
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
  // Packed latents are 2 x 2 patches of the VAE's channels; Fill's transformer also takes the masked image's
  // latents and the mask's 8 x 8 pixels per latent, packed alike.
  const int64_t packed = 4 * pipe.vae_->config().latent_channels;
  const int64_t mask_values = 4 * pipe.vae_->config().scale_factor() * pipe.vae_->config().scale_factor();
  const bool fill = find_pipeline_class(pipeline_class)->task == Task::Fill;
  const int64_t expected = fill ? 2 * packed + mask_values : packed;
  KILN_CHECK(tc.in_channels == expected && tc.out_channels == packed,
             pipe.path_ << ": transformer in_channels " << tc.in_channels << " and out_channels "
                        << tc.out_channels << " do not fit " << pipeline_class << " (expected " << expected
                        << " and " << packed << " for vae latent_channels "
                        << pipe.vae_->config().latent_channels << ")");
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

  // diffusers: prompt_2 = prompt_2 or prompt (an empty prompt_2 falls back too).
  const std::string& t5_prompt = prompt_2 && !prompt_2->empty() ? *prompt_2 : prompt;
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

FluxPipeline::PromptEmbeddings FluxPipeline::encode_prompts(const std::vector<std::string>& prompts,
                                                            const std::optional<std::string>& prompt_2,
                                                            int num_images_per_prompt,
                                                            int64_t max_sequence_length) const {
  PromptEmbeddings out = encode_prompt(prompts.front(), prompt_2, num_images_per_prompt, max_sequence_length);
  if (prompts.size() == 1) return out;
  // diffusers encodes the list as one batch; each prompt's rows are its own encoding, repeated n times.
  std::vector<Tensor> embeds{out.prompt_embeds}, pooled{out.pooled_prompt_embeds};
  for (size_t i = 1; i < prompts.size(); ++i) {
    const PromptEmbeddings p =
        encode_prompt(prompts[i], prompt_2, num_images_per_prompt, max_sequence_length);
    embeds.push_back(p.prompt_embeds);
    pooled.push_back(p.pooled_prompt_embeds);
  }
  out.prompt_embeds = concat(embeds, 0);
  out.pooled_prompt_embeds = concat(pooled, 0);
  return out;
}

std::pair<Tensor, Tensor> FluxPipeline::prepare_latents(int64_t batch, int64_t height, int64_t width,
                                                        DType dtype, Generator& generator) const {
  return prepare_latents(batch, height, width, dtype, std::vector<Generator*>{&generator});
}

std::pair<Tensor, Tensor> FluxPipeline::prepare_latents(int64_t batch, int64_t height, int64_t width,
                                                        DType dtype,
                                                        const std::vector<Generator*>& generators) const {
  const int64_t f = vae_->config().scale_factor();
  const int64_t h = 2 * (height / (f * 2)), w = 2 * (width / (f * 2));
  const int64_t c = transformer_->config().in_channels / 4;
  const Tensor noise = randn_tensor({batch, c, h, w}, generators, dtype);
  return {pack(noise), models::flux_latent_image_ids(h / 2, w / 2, dtype)};
}

Tensor FluxPipeline::pack(const Tensor& latents) {
  return models::flux_pack_latents(latents);
}

Tensor FluxPipeline::encode_image(const Tensor& image, DType dtype, Generator& generator) const {
  // diffusers: (latents - shift_factor) * scaling_factor, in the latents' dtype.
  return pipelines::encode_image(*vae_, image, dtype, &generator);
}

Tensor FluxPipeline::decode_latents(const Tensor& latents, int64_t height, int64_t width) const {
  const int64_t f = vae_->config().scale_factor();
  const int64_t h = 2 * (height / (f * 2)), w = 2 * (width / (f * 2));
  const Tensor unpacked = models::flux_unpack_latents(latents, h, w);
  // diffusers: latents / scaling_factor + shift_factor, in the latents' dtype.
  return pipelines::postprocess(vae_->decode(vae_->from_latents(unpacked)));
}

namespace {

// diffusers' PREFERRED_KONTEXT_RESOLUTIONS: (width, height) Kontext was trained at.
constexpr std::pair<int64_t, int64_t> kKontextResolutions[] = {
    {672, 1568}, {688, 1504}, {720, 1456},  {752, 1392}, {800, 1328}, {832, 1248},
    {880, 1184}, {944, 1104}, {1024, 1024}, {1104, 944}, {1184, 880}, {1248, 832},
    {1328, 800}, {1392, 752}, {1456, 720},  {1504, 688}, {1568, 672}};

}  // namespace

std::pair<int64_t, int64_t> FluxKontextPipeline::output_size(const PipelineRequest& request) const {
  const PipelineDefaults d = defaults();
  const double height = static_cast<double>(request.height.value_or(d.height));
  const double width = static_cast<double>(request.width.value_or(d.width));
  const double area = static_cast<double>(request.max_area.value_or(1024 * 1024));
  const double aspect = width / height;
  // Python's round() (half to even) of the sizes at max_area, floored to multiples of 16.
  const auto rounded = [](double x) { return static_cast<int64_t>(std::nearbyint(x)); };
  const int64_t w = rounded(std::pow(area * aspect, 0.5)) / 16 * 16;
  const int64_t h = rounded(std::pow(area / aspect, 0.5)) / 16 * 16;
  return {h, w};
}

std::pair<int64_t, int64_t> FluxKontextPipeline::image_size(const Image& image, bool auto_resize) {
  int64_t w = image.width / 16 * 16, h = image.height / 16 * 16;
  if (auto_resize) {
    // min((abs(aspect - w / h), w, h)) over the resolutions: the nearest aspect ratio, ties to the smaller.
    const double aspect = static_cast<double>(w) / static_cast<double>(h);
    double best = 0;
    bool first = true;
    for (const auto& [pw, ph] : kKontextResolutions) {
      const double distance = std::abs(aspect - static_cast<double>(pw) / static_cast<double>(ph));
      if (first || distance < best) {
        best = distance;
        w = pw;
        h = ph;
        first = false;
      }
    }
  }
  return {h / 16 * 16, w / 16 * 16};
}

PipelineDefaults FluxImg2ImgPipeline::family_defaults() const {
  return {.guidance_scale = 7.0f, .strength = 0.6};
}
PipelineDefaults FluxInpaintPipeline::family_defaults() const {
  return {.guidance_scale = 7.0f, .strength = 0.6};
}
PipelineDefaults FluxFillPipeline::family_defaults() const {
  return {.num_inference_steps = 50, .guidance_scale = 30.0f, .strength = 1.0};
}

bool FluxPipeline::negative_evaluations(const PipelineRequest& request) const {
  // As call_prompts decides it: true_cfg_scale defaults to 1 (off).
  return request.true_cfg_scale.value_or(1.0f) > 1.0f && pipelines::has_negative_prompt(request);
}

void FluxPipeline::check_loaded_request(const PipelineRequest& request) const {
  const char* name = class_name();
  pipelines::ResolvedRequest r = pipelines::resolve(request, defaults());
  resize_call(request, r);
  pipelines::check_image_size(name, r.height, r.width, vae_->config().scale_factor() * 2);
  const auto& tc = transformer_->config();
  pipelines::check_given_embeddings(name, request, tc.joint_attention_dim, limits::kMaxSequenceLength,
                                    tc.pooled_projection_dim);
  pipelines::check_task_inputs(registered_class().task, name, request, r);
}

void FluxKontextPipeline::check_loaded_request(const PipelineRequest& request) const {
  const char* name = class_name();
  if (request.height) pipelines::check_image_size(name, *request.height, 16, 16);
  if (request.width) pipelines::check_image_size(name, 16, *request.width, 16);
  for (const Image& image : request.image)
    pipelines::refuse(image.width < 16 || image.height < 16, "image",
                      std::string(name) + ": the image is " + std::to_string(image.width) + "x" +
                          std::to_string(image.height) + " pixels; both sides must be at least 16");
  FluxPipeline::check_loaded_request(request);
}

void FluxPipeline::resize_call(const PipelineRequest&, pipelines::ResolvedRequest&) const {}

void FluxKontextPipeline::resize_call(const PipelineRequest& request,
                                      pipelines::ResolvedRequest& call) const {
  std::tie(call.height, call.width) = output_size(request);
}

FluxPipeline::DenoiserInputs FluxPipeline::denoiser_inputs(const pipelines::TaskCall&,
                                                           const pipelines::TaskStart&) const {
  return {};
}

FluxPipeline::DenoiserInputs FluxFillPipeline::denoiser_inputs(const pipelines::TaskCall& c,
                                                               const pipelines::TaskStart& start) const {
  const int64_t f = vae().config().scale_factor();
  const int64_t h = c.call.height / f, w = c.call.width / f;
  // The masked image (black where the mask repaints) encoded: the generator's third draw.
  const Tensor masked = mul(start.image, sub(1.0, start.mask));
  const Tensor masked_latents = pipelines::encode_image(vae(), masked, c.dtype, &c.generators.single());
  const Tensor repeated = c.batch > 1
                              ? concat(std::vector<Tensor>(static_cast<size_t>(c.batch), masked_latents), 0)
                              : masked_latents;
  // The mask's 8 x 8 pixels per latent as channels: [B, H, W] -> [B, 64, h, w], packed to [B, N, 256].
  const Tensor pixels = start.mask.select(1, 0).expand({c.batch, h * f, w * f}).contiguous();
  const Tensor per_latent =
      pixels.view({c.batch, h, f, w, f}).permute({0, 2, 4, 1, 3}).reshape({c.batch, f * f, h, w}).to(c.dtype);
  return {.condition = concat({pack(repeated), pack(per_latent).to(repeated.device())}, 2)};
}

FluxPipeline::DenoiserInputs FluxKontextPipeline::denoiser_inputs(const pipelines::TaskCall& c,
                                                                  const pipelines::TaskStart&) const {
  if (c.request.image.empty()) return {};
  const auto [ih, iw] = image_size(c.request.image.front(), c.request.auto_resize.value_or(true));
  const Tensor init = pipelines::preprocess_image(c.request.image.front(), ih, iw);
  const Tensor encoded = pipelines::encode_image(vae(), init, c.dtype, nullptr);
  const Tensor repeated =
      c.batch > 1 ? concat(std::vector<Tensor>(static_cast<size_t>(c.batch), encoded), 0) : encoded;
  const Tensor first = Tensor::from_vector(std::vector<float>{1, 0, 0}, {1, 3}).to(c.dtype);
  return {.context = pack(repeated),
          .context_ids =
              add(models::flux_latent_image_ids(encoded.size(2) / 2, encoded.size(3) / 2, c.dtype), first)};
}

FluxPipeline::CallPrompts FluxPipeline::call_prompts(const PipelineRequest& request,
                                                     int64_t max_sequence_length) const {
  const std::vector<std::string> prompts = pipelines::prompt_list(request);
  const int n = request.num_images_per_prompt;
  // Given embeddings (diffusers' prompt_embeds with pooled_prompt_embeds) in the pipeline's dtype, each row
  // n times, or the prompts encoded.
  const auto given = [&](const Tensor& embeds, const Tensor& pooled) {
    const Tensor e = pipelines::repeat_per_prompt(embeds.to(dtype_), n);
    return PromptEmbeddings{.prompt_embeds = e,
                            .pooled_prompt_embeds = pipelines::repeat_per_prompt(pooled.to(dtype_), n),
                            .text_ids = models::flux_text_ids(e.size(1), dtype_)};
  };
  const PromptEmbeddings prompt = request.prompt_embeds.defined()
                                      ? given(request.prompt_embeds, request.pooled_prompt_embeds)
                                      : encode_prompts(prompts, request.prompt_2, n, max_sequence_length);
  // True classifier-free guidance (diffusers' do_true_cfg): only with a negative prompt and a scale above 1.
  const float true_cfg_scale = request.true_cfg_scale.value_or(1.0f);
  const bool true_cfg = true_cfg_scale > 1.0f && pipelines::has_negative_prompt(request);
  if (!true_cfg && pipelines::has_negative_prompt(request))
    warn(std::string(class_name()) + ": negative_prompt is ignored unless true_cfg_scale > 1 (got " +
         std::to_string(true_cfg_scale) + "), as in diffusers");
  else if (!true_cfg && request.negative_prompt_2)
    warn(std::string(class_name()) +
         ": negative_prompt_2 is ignored without negative_prompt, as in diffusers");
  else if (!true_cfg && true_cfg_scale > 1.0f)
    warn(std::string(class_name()) +
         ": true_cfg_scale has no effect without negative_prompt, as in diffusers");
  std::optional<PromptEmbeddings> negative;
  if (true_cfg && request.negative_prompt_embeds.defined()) {
    negative = given(request.negative_prompt_embeds, request.negative_pooled_prompt_embeds);
  } else if (true_cfg) {
    // One negative prompt per prompt (or per given embedding row).
    std::vector<std::string> negatives;
    for (int64_t i = 0; i < prompt.prompt_embeds.size(0) / n; ++i)
      negatives.push_back(*pipelines::negative_prompt_of(request, static_cast<size_t>(i)));
    negative = encode_prompts(negatives, request.negative_prompt_2, n, max_sequence_length);
  }
  return {.positive = prompt, .negative = negative, .true_cfg_scale = true_cfg_scale};
}

PipelineOutput FluxPipeline::run(const PipelineRequest& request, const pipelines::CallControl& control) {
  pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  resize_call(request, call);
  // encode: the prompts (and true CFG's negative ones); the text encoders' memory then goes to the
  // transformer.
  const CallPrompts prompts = call_prompts(request, call.max_sequence_length);
  const PromptEmbeddings& prompt = prompts.positive;
  const std::optional<PromptEmbeddings>& negative = prompts.negative;
  const float true_cfg_scale = prompts.true_cfg_scale;
  release_after_use({{"text_encoder", text_encoder_.get()}, {"text_encoder_2", text_encoder_2_.get()}});
  pipelines::CallGenerators generators(request);
  const int64_t batch = pipelines::batch_size(request);
  const DType dtype = prompt.prompt_embeds.dtype();
  const int64_t f = vae_->config().scale_factor();
  const int64_t h = 2 * (call.height / (f * 2)), w = 2 * (call.width / (f * 2));

  // The call's own schedule (the pipeline's scheduler is never changed by a call), shifted by the image's
  // token count.
  FlowMatchEulerDiscreteScheduler schedule = *scheduler_;
  schedule.set_timesteps(call.num_inference_steps, flux_sigmas(call.num_inference_steps),
                         calculate_shift(schedule.config(), (h / 2) * (w / 2)));

  // prepare: where the task starts (pipelines/task_stages.h), and what this class's transformer reads beside
  // it.
  const pipelines::TaskCall task{.task = registered_class().task,
                                 .pipeline = class_name(),
                                 .request = request,
                                 .call = call,
                                 .batch = batch,
                                 .dtype = dtype,
                                 .generators = generators,
                                 .schedule = schedule,
                                 .codec = *vae_,
                                 .pack = pack};
  const pipelines::TaskStart start = pipelines::start_latents(task);
  // Named tensors, not structured bindings: the step lambda captures them (clang 14 cannot capture bindings).
  const DenoiserInputs inputs = denoiser_inputs(task, start);
  const Tensor condition = inputs.condition, context = inputs.context;
  const Tensor latent_ids = models::flux_latent_image_ids(h / 2, w / 2, dtype);
  const Tensor image_ids = context.defined() ? concat({latent_ids, inputs.context_ids}, 0) : latent_ids;
  Tensor guidance;
  if (transformer_->config().guidance_embeds)
    guidance = Tensor::full({batch}, static_cast<double>(call.guidance_scale), float32);

  // denoise, decode
  const auto model_output = [&](const Tensor& x, int, float timestep) {
    // diffusers: t.expand(B).to(latents.dtype) / 1000, in the latents' dtype.
    const Tensor t = div(Tensor::full({batch}, timestep, float32).to(x.dtype()), 1000.0);
    // Fill: the condition beside each token's channels; Kontext: the image's tokens after the latents', their
    // prediction dropped.
    const Tensor input = condition.defined() ? concat({x, condition.to(x.device())}, 2)
                         : context.defined() ? concat({x, context.to(x.device())}, 1)
                                             : x;
    const auto predict = [&](const PromptEmbeddings& p) {
      const Tensor out = transformer_->forward(input, p.prompt_embeds, p.pooled_prompt_embeds, t, guidance,
                                               p.text_ids, image_ids);
      return context.defined() ? out.narrow(1, 0, x.size(1)) : out;
    };
    const Tensor positive = predict(prompt);
    if (!negative) return positive;
    // diffusers: neg + true_cfg_scale * (pos - neg), two calls of batch B (not one of 2B), each in its own
    // step cache context.
    cache_context("uncond");
    const Tensor uncond = predict(*negative);
    cache_context("cond");
    return add(uncond, mul(static_cast<double>(true_cfg_scale), sub(positive, uncond)));
  };
  std::map<std::string, std::string> extra;
  if (negative) extra["true_cfg_scale"] = std::to_string(true_cfg_scale);
  return denoise_and_decode(
      task, start, model_output,
      [&](const Tensor& latents) { return decode_latents(latents, call.height, call.width); },
      negative.has_value(), std::move(extra), control);
}

std::vector<std::pair<std::string, nn::Module*>> FluxPipeline::components() const {
  return {{"text_encoder", text_encoder_.get()},
          {"text_encoder_2", text_encoder_2_.get()},
          {"transformer", transformer_.get()},
          {"vae", vae_.get()}};
}

models::LatentCodec& FluxPipeline::latent_codec() const {
  return *vae_;
}

nn::Module& FluxPipeline::denoiser() {
  return *transformer_;
}

ActivationEstimate FluxPipeline::estimate_activations(const PipelineRequest& request,
                                                      const Device& device) const {
  pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  resize_call(request, call);
  const models::FluxTransformerConfig& tc = transformer_->config();
  const int64_t f = vae_->config().scale_factor() * 2;  // pixels per token: the latents are packed 2x2
  int64_t image_tokens = (call.height / f) * (call.width / f);
  // An image to edit (Kontext) adds its tokens beside them, about as many.
  if (registered_class().task == Task::ImageEditing && !request.image.empty()) image_tokens *= 2;
  ActivationEstimate e{.height = call.height, .width = call.width};
  e.text_encoders =
      std::max(pipelines::clip_activation_bytes(text_encoder_->config(), dtype(), device),
               pipelines::t5_activation_bytes(text_encoder_2_->config(), call.max_sequence_length, dtype()));
  e.transformer = pipelines::dit_step_activation_bytes(
      pipelines::batch_size(request), image_tokens + call.max_sequence_length, tc.num_attention_heads,
      tc.attention_head_dim, dtype(), device);
  e.vae =
      vae_activation_bytes(*vae_, pipelines::batch_size(request), call.height, call.width, dtype(), device);
  return e;
}

}  // namespace kiln
