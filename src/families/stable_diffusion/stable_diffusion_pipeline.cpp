#include "kiln/families/stable_diffusion/stable_diffusion_pipeline.h"

#include <optional>

#include "families/family_helpers.h"
#include "families/stable_diffusion/sd_components.h"
#include "families/stable_diffusion/unet_activations.h"
#include "families/stable_diffusion/unet_guidance.h"
#include "families/stable_diffusion/unet_samplers.h"
#include "kiln/core/log.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/ops.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/tokenizers/clip_tokenizer.h"
#include "pipelines/call_control.h"
#include "pipelines/call_generators.h"
#include "pipelines/encoder_activations.h"
#include "pipelines/pipeline_common.h"
#include "pipelines/task_stages.h"

namespace kiln {

namespace {

constexpr const char* kSiblings[] = {"StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline",
                                     "StableDiffusionInpaintPipeline"};

}  // namespace

StableDiffusionPipeline::StableDiffusionPipeline() = default;
StableDiffusionPipeline::StableDiffusionPipeline(StableDiffusionPipeline&&) noexcept = default;
StableDiffusionPipeline& StableDiffusionPipeline::operator=(StableDiffusionPipeline&&) noexcept = default;
StableDiffusionPipeline::~StableDiffusionPipeline() = default;
StableDiffusionPipeline::StableDiffusionPipeline(const StableDiffusionPipeline& pipe, SharingComponents)
    : DiffusionPipeline(pipe, SharingComponents{}),
      tokenizer_(pipe.tokenizer_),
      text_encoder_(pipe.text_encoder_),
      unet_(pipe.unet_),
      vae_(pipe.vae_),
      samplers_(pipe.samplers_) {}

StableDiffusionPipeline StableDiffusionPipeline::from_pipe(const StableDiffusionPipeline& pipe) {
  return StableDiffusionPipeline(pipe, SharingComponents{});
}
StableDiffusionImg2ImgPipeline StableDiffusionImg2ImgPipeline::from_pipe(
    const StableDiffusionPipeline& pipe) {
  return StableDiffusionImg2ImgPipeline(pipe, SharingComponents{});
}
StableDiffusionInpaintPipeline StableDiffusionInpaintPipeline::from_pipe(
    const StableDiffusionPipeline& pipe) {
  return StableDiffusionInpaintPipeline(pipe, SharingComponents{});
}

StableDiffusionPipeline StableDiffusionPipeline::from_pretrained(const std::string& model,
                                                                 const PipelineLoadOptions& options) {
  StableDiffusionPipeline pipe;
  load(pipe, model, options, "StableDiffusionPipeline");
  return pipe;
}

StableDiffusionImg2ImgPipeline StableDiffusionImg2ImgPipeline::from_pretrained(
    const std::string& model, const PipelineLoadOptions& options) {
  StableDiffusionImg2ImgPipeline pipe;
  load(pipe, model, options, "StableDiffusionImg2ImgPipeline");
  return pipe;
}

StableDiffusionInpaintPipeline StableDiffusionInpaintPipeline::from_pretrained(
    const std::string& model, const PipelineLoadOptions& options) {
  StableDiffusionInpaintPipeline pipe;
  load(pipe, model, options, "StableDiffusionInpaintPipeline");
  return pipe;
}

PipelineDefaults StableDiffusionPipeline::family_defaults() const {
  const int64_t side = unet_->config().sample_size * vae_->config().scale_factor();
  return {.height = side, .width = side, .num_inference_steps = 50, .guidance_scale = 7.5f};
}

PipelineDefaults StableDiffusionImg2ImgPipeline::family_defaults() const {
  PipelineDefaults d = StableDiffusionPipeline::family_defaults();
  d.strength = 0.8;
  return d;
}

PipelineDefaults StableDiffusionInpaintPipeline::family_defaults() const {
  return StableDiffusionPipeline::family_defaults();
}

void StableDiffusionPipeline::load(StableDiffusionPipeline& pipe, const std::string& model,
                                   const PipelineLoadOptions& options, const char* pipeline_class) {
  pipelines::PipelineFolder folder(model, options, pipeline_class,
                                   {kSiblings[0], kSiblings[1], kSiblings[2]});
  folder.set_component_count(5);
  // No component of the family is split yet: refused rather than run whole on every rank.
  KILN_CHECK(
      options.tensor_parallel <= 1 && options.parallel_config.empty(),
      pipeline_class << ": tensor parallelism (--tp) splits no component of the UNet family yet (the "
                        "UNet's attention and feed-forward could be; its convolutions would not): run it "
                        "with --tp 1");
  pipe.path_ = folder.path();
  pipe.name_ = options.single_file.empty() ? model : options.single_file;  // what the images name
  pipe.dtype_ = options.dtype;
  pipe.make_context(options, model);
  ExecutionScope loading_in(pipe.context());
  const auto done = [&](const char* name) { folder.loaded(name); };
  // A finetune's single file: its components, the folder's configs (and components the file lacks).
  std::optional<models::StableDiffusionSingleFile> file;
  if (!options.single_file.empty()) {
    file = models::open_stable_diffusion_single_file(options.single_file);
    KILN_CHECK(file->kind == models::StableDiffusionSingleFile::Kind::SD1,
               options.single_file << ": an " << models::kind_name(file->kind) << " checkpoint, which "
                                   << "StableDiffusionXLPipeline runs, not " << pipeline_class);
  }
  pipe.samplers_ = std::make_shared<UNetSamplers>(
      folder.need("scheduler", {"PNDMScheduler", "EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler",
                                "DPMSolverMultistepScheduler", "DDIMScheduler"}));
  done("scheduler");
  pipe.tokenizer_ = std::make_shared<tokenizers::ClipTokenizer>(tokenizers::ClipTokenizer::from_directory(
      folder.need("tokenizer", {"CLIPTokenizer", "CLIPTokenizerFast"})));
  done("tokenizer");
  pipe.text_encoder_ = models::load_clip(folder.need("text_encoder", {"CLIPTextModel"}), options.dtype,
                                         file ? file->text_encoder.get() : nullptr);
  done("text_encoder");
  pipe.unet_ = models::load_unet(folder.need("unet", {"UNet2DConditionModel"}), options.dtype,
                                 file ? &*file : nullptr);
  done("unet");
  pipe.vae_ = models::load_vae(folder.need("vae", {"AutoencoderKL"}), options.dtype,
                               file ? file->vae.get() : nullptr);
  done("vae");
  pipe.finish_loading(options.packed_weight_budget);
  const auto& uc = pipe.unet_->config();
  KILN_CHECK(!uc.text_time(), pipe.path_
                                  << ": the UNet takes SDXL's added conditions (addition_embed_type "
                                     "\"text_time\"): an SDXL folder, which StableDiffusionXLPipeline runs");
  KILN_CHECK(uc.cross_attention_dim == pipe.text_encoder_->config().hidden_size,
             pipe.path_ << ": unet cross_attention_dim " << uc.cross_attention_dim
                        << " does not match text_encoder hidden_size "
                        << pipe.text_encoder_->config().hidden_size);
  KILN_CHECK(
      uc.in_channels == pipe.vae_->config().latent_channels,
      pipe.path_ << ": unet in_channels " << uc.in_channels << " is not the vae's latent_channels "
                 << pipe.vae_->config().latent_channels
                 << (uc.in_channels == 9 ? " (a 9-channel inpainting UNet, which Kiln does not run yet)"
                                         : ""));
}

Tensor StableDiffusionPipeline::tokenize(const std::vector<std::string>& prompts) const {
  const int64_t length = tokenizer_->model_max_length();
  tokenizers::EncodeOptions options;
  options.max_length = length;
  std::vector<int64_t> ids;
  for (const std::string& prompt : prompts) {
    if (static_cast<int64_t>(tokenizer_->tokenize(prompt).size()) + 2 > length)
      warn("the prompt is longer than CLIP's " + std::to_string(length) + " tokens and was truncated");
    const std::vector<int64_t> row = tokenizer_->encode(prompt, options).ids;
    ids.insert(ids.end(), row.begin(), row.end());
  }
  return Tensor::from_vector(ids, {static_cast<int64_t>(prompts.size()), length});
}

Tensor StableDiffusionPipeline::encode_prompt(const std::vector<std::string>& prompts, int clip_skip) const {
  const models::ClipTextOutput o = text_encoder_->forward(tokenize(prompts), clip_skip > 0);
  if (clip_skip == 0) return o.last_hidden_state.to(dtype_);
  // hidden_states[-(clip_skip + 1)], through the final layer norm (diffusers applies it by hand).
  const auto index = static_cast<int64_t>(o.hidden_states.size()) - 1 - clip_skip;
  return text_encoder_->final_layer_norm(o.hidden_states.at(static_cast<size_t>(index))).to(dtype_);
}

void StableDiffusionPipeline::check_loaded_request(const PipelineRequest& request) const {
  const char* name = class_name();
  const int64_t multiple = vae_->config().scale_factor();
  const pipelines::ResolvedRequest r =
      pipelines::resolve_with_image_size(request, defaults(), registered_class().edits_an_image(), multiple);
  pipelines::check_image_size(name, r.height, r.width, multiple);
  pipelines::check_task_inputs(registered_class().task, name, request, r);
  samplers_->check(request);
  if (request.clip_skip) {
    const int64_t layers = text_encoder_->config().num_hidden_layers;
    if (*request.clip_skip >= layers)
      throw RequestError("clip_skip", std::string(name) + ": clip_skip " +
                                          std::to_string(*request.clip_skip) +
                                          " leaves no layer of the text encoder's " + std::to_string(layers));
  }
}

PipelineOutput StableDiffusionPipeline::run(const PipelineRequest& request,
                                            const pipelines::CallControl& control) {
  const int64_t multiple = vae_->config().scale_factor();
  const pipelines::ResolvedRequest call =
      pipelines::resolve_with_image_size(request, defaults(), registered_class().edits_an_image(), multiple);
  const int n = request.num_images_per_prompt;
  const std::vector<std::string> prompts = pipelines::prompt_list(request);
  const int clip_skip = request.clip_skip.value_or(0);
  // encode: classifier-free guidance when guidance_scale > 1, with "" as the negative prompt when none is
  // given.
  const bool guided = call.guidance_scale > 1.0f;
  if (!guided && pipelines::has_negative_prompt(request))
    warn(std::string(class_name()) +
         ": negative_prompt is ignored when guidance_scale is at most 1, as in diffusers");
  Tensor context = pipelines::repeat_per_prompt(encode_prompt(prompts, clip_skip), n);
  if (guided) {
    std::vector<std::string> negatives;
    for (size_t i = 0; i < prompts.size(); ++i)
      negatives.push_back(pipelines::negative_prompt_of(request, i).value_or(""));
    // The negative side reads the last layer whatever clip_skip says (diffusers applies it to the prompt
    // only).
    context = concat({pipelines::repeat_per_prompt(encode_prompt(negatives, 0), n), context}, 0);
  }
  release_after_use({{"text_encoder", text_encoder_.get()}});

  pipelines::CallGenerators generators(request);
  const std::unique_ptr<Scheduler> schedule = samplers_->for_call(request, call.num_inference_steps);
  const pipelines::TaskCall task{.task = registered_class().task,
                                 .pipeline = class_name(),
                                 .request = request,
                                 .call = call,
                                 .batch = pipelines::batch_size(request),
                                 .dtype = dtype_,
                                 .generators = generators,
                                 .schedule = *schedule,
                                 .codec = *vae_,
                                 .noise_at_full_strength = true};
  const pipelines::TaskStart start = pipelines::start_latents(task);
  const models::UNetStep step{.unet = *unet_,
                              .context = context,
                              .guided = guided,
                              .guidance_scale = call.guidance_scale,
                              .guidance_rescale = request.guidance_rescale.value_or(0.0f)};
  return denoise_and_decode(
      task, start,
      [&](const Tensor& latents, int, float t) { return models::unet_noise_prediction(step, latents, t); },
      [&](const Tensor& latents) {
        return pipelines::postprocess(vae_->decode(vae_->from_latents(latents.to(dtype_))));
      },
      guided, {{"scheduler", samplers_->describe(request)}}, control);
}

std::vector<std::pair<std::string, nn::Module*>> StableDiffusionPipeline::components() const {
  return {{"text_encoder", text_encoder_.get()}, {"unet", unet_.get()}, {"vae", vae_.get()}};
}

models::LatentCodec& StableDiffusionPipeline::latent_codec() const {
  return *vae_;
}

nn::Module& StableDiffusionPipeline::denoiser() {
  return *unet_;
}

ActivationEstimate StableDiffusionPipeline::estimate_activations(const PipelineRequest& request,
                                                                 const Device& device) const {
  const int64_t multiple = vae_->config().scale_factor();
  const pipelines::ResolvedRequest call =
      pipelines::resolve_with_image_size(request, defaults(), registered_class().edits_an_image(), multiple);
  ActivationEstimate e{.height = call.height, .width = call.width};
  const int64_t batch = pipelines::batch_size(request) * (call.guidance_scale > 1.0f ? 2 : 1);
  e.text_encoders = pipelines::clip_activation_bytes(text_encoder_->config(), dtype(), device);
  e.transformer =
      unet_activation_bytes(unet_->config(), batch, call.height / multiple, call.width / multiple, dtype());
  e.vae =
      vae_activation_bytes(*vae_, pipelines::batch_size(request), call.height, call.width, dtype(), device);
  return e;
}

}  // namespace kiln
