#include "kiln/families/stable_diffusion/stable_diffusion_xl_pipeline.h"

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

constexpr const char* kSiblings[] = {"StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline",
                                     "StableDiffusionXLInpaintPipeline"};

// A (height, width)-like pair of the request, or `fallback` when unset; RequestError unless it has 2 values.
std::vector<int64_t> pair_or(const std::vector<int64_t>& given, const char* field,
                             std::vector<int64_t> fallback) {
  if (given.empty()) return fallback;
  if (given.size() != 2)
    throw RequestError(field,
                       std::string(field) + " takes 2 values (" +
                           (std::string(field) == "crops_coords_top_left" ? "top, left" : "height, width") +
                           "), got " + std::to_string(given.size()));
  return given;
}

}  // namespace

StableDiffusionXLPipeline::StableDiffusionXLPipeline() = default;
StableDiffusionXLPipeline::StableDiffusionXLPipeline(StableDiffusionXLPipeline&&) noexcept = default;
StableDiffusionXLPipeline& StableDiffusionXLPipeline::operator=(StableDiffusionXLPipeline&&) noexcept =
    default;
StableDiffusionXLPipeline::~StableDiffusionXLPipeline() = default;
StableDiffusionXLPipeline::StableDiffusionXLPipeline(const StableDiffusionXLPipeline& pipe, SharingComponents)
    : DiffusionPipeline(pipe, SharingComponents{}),
      tokenizer_(pipe.tokenizer_),
      tokenizer_2_(pipe.tokenizer_2_),
      text_encoder_(pipe.text_encoder_),
      text_encoder_2_(pipe.text_encoder_2_),
      unet_(pipe.unet_),
      vae_(pipe.vae_),
      samplers_(pipe.samplers_),
      force_zeros_for_empty_prompt_(pipe.force_zeros_for_empty_prompt_) {}

StableDiffusionXLPipeline StableDiffusionXLPipeline::from_pipe(const StableDiffusionXLPipeline& pipe) {
  return StableDiffusionXLPipeline(pipe, SharingComponents{});
}
StableDiffusionXLImg2ImgPipeline StableDiffusionXLImg2ImgPipeline::from_pipe(
    const StableDiffusionXLPipeline& pipe) {
  return StableDiffusionXLImg2ImgPipeline(pipe, SharingComponents{});
}
StableDiffusionXLInpaintPipeline StableDiffusionXLInpaintPipeline::from_pipe(
    const StableDiffusionXLPipeline& pipe) {
  return StableDiffusionXLInpaintPipeline(pipe, SharingComponents{});
}

StableDiffusionXLPipeline StableDiffusionXLPipeline::from_pretrained(const std::string& model,
                                                                     const PipelineLoadOptions& options) {
  StableDiffusionXLPipeline pipe;
  load(pipe, model, options, kSiblings[0]);
  return pipe;
}

StableDiffusionXLImg2ImgPipeline StableDiffusionXLImg2ImgPipeline::from_pretrained(
    const std::string& model, const PipelineLoadOptions& options) {
  StableDiffusionXLImg2ImgPipeline pipe;
  load(pipe, model, options, kSiblings[1]);
  return pipe;
}

StableDiffusionXLInpaintPipeline StableDiffusionXLInpaintPipeline::from_pretrained(
    const std::string& model, const PipelineLoadOptions& options) {
  StableDiffusionXLInpaintPipeline pipe;
  load(pipe, model, options, kSiblings[2]);
  return pipe;
}

PipelineDefaults StableDiffusionXLPipeline::family_defaults() const {
  const int64_t side = unet_->config().sample_size * vae_->config().scale_factor();
  return {.height = side, .width = side, .num_inference_steps = 50, .guidance_scale = 5.0f};
}

PipelineDefaults StableDiffusionXLImg2ImgPipeline::family_defaults() const {
  PipelineDefaults d = StableDiffusionXLPipeline::family_defaults();
  d.strength = 0.3;
  return d;
}

PipelineDefaults StableDiffusionXLInpaintPipeline::family_defaults() const {
  PipelineDefaults d = StableDiffusionXLPipeline::family_defaults();
  d.strength = 0.9999;
  return d;
}

void StableDiffusionXLPipeline::load(StableDiffusionXLPipeline& pipe, const std::string& model,
                                     const PipelineLoadOptions& options, const char* pipeline_class) {
  pipelines::PipelineFolder folder(model, options, pipeline_class,
                                   {kSiblings[0], kSiblings[1], kSiblings[2]});
  KILN_CHECK(folder.present("text_encoder"),
             folder.index().path
                 << ": no text_encoder: an SDXL refiner folder (text_encoder_2 alone, aesthetic-score "
                    "conditioning), which Kiln does not run yet");
  folder.set_component_count(7);
  // No component of the family is split yet: refused rather than run whole on every rank.
  KILN_CHECK(
      options.tensor_parallel <= 1 && options.parallel_config.empty(),
      pipeline_class << ": tensor parallelism (--tp) splits no component of the UNet family yet (the "
                        "UNet's attention and feed-forward could be; its convolutions would not): run it "
                        "with --tp 1");
  pipe.path_ = folder.path();
  pipe.name_ = options.single_file.empty() ? model : options.single_file;  // what the images name
  pipe.dtype_ = options.dtype;
  pipe.force_zeros_for_empty_prompt_ = folder.index().raw.get_or<bool>("force_zeros_for_empty_prompt", true);
  pipe.make_context(options, model);
  ExecutionScope loading_in(pipe.context());
  const auto done = [&](const char* name) { folder.loaded(name); };
  // A finetune's single file: its components, the folder's configs (and components the file lacks).
  std::optional<models::StableDiffusionSingleFile> file;
  if (!options.single_file.empty()) {
    file = models::open_stable_diffusion_single_file(options.single_file);
    KILN_CHECK(file->kind == models::StableDiffusionSingleFile::Kind::SDXL,
               options.single_file << ": an " << models::kind_name(file->kind) << " checkpoint, which "
                                   << "StableDiffusionPipeline runs, not " << pipeline_class);
  }
  pipe.samplers_ = std::make_shared<UNetSamplers>(
      folder.need("scheduler", {"EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler",
                                "DPMSolverMultistepScheduler", "DDIMScheduler", "PNDMScheduler"}));
  done("scheduler");
  const auto clip_tokenizer = [&](const char* name) {
    return std::make_shared<tokenizers::ClipTokenizer>(
        tokenizers::ClipTokenizer::from_directory(folder.need(name, {"CLIPTokenizer", "CLIPTokenizerFast"})));
  };
  pipe.tokenizer_ = clip_tokenizer("tokenizer");
  done("tokenizer");
  pipe.tokenizer_2_ = clip_tokenizer("tokenizer_2");
  done("tokenizer_2");
  pipe.text_encoder_ = models::load_clip(folder.need("text_encoder", {"CLIPTextModel"}), options.dtype,
                                         file ? file->text_encoder.get() : nullptr);
  done("text_encoder");
  pipe.text_encoder_2_ = models::load_clip(folder.need("text_encoder_2", {"CLIPTextModelWithProjection"}),
                                           options.dtype, file ? file->text_encoder_2.get() : nullptr);
  done("text_encoder_2");
  pipe.unet_ = models::load_unet(folder.need("unet", {"UNet2DConditionModel"}), options.dtype,
                                 file ? &*file : nullptr);
  done("unet");
  pipe.vae_ = models::load_vae(folder.need("vae", {"AutoencoderKL"}), options.dtype,
                               file ? file->vae.get() : nullptr);
  done("vae");
  pipe.finish_loading(options.packed_weight_budget);
  const auto& uc = pipe.unet_->config();
  const auto& one = pipe.text_encoder_->config();
  const auto& two = pipe.text_encoder_2_->config();
  KILN_CHECK(two.with_projection, pipe.path_ << ": text_encoder_2 must be a CLIPTextModelWithProjection");
  KILN_CHECK(uc.text_time(), pipe.path_ << ": the UNet takes no added conditions (addition_embed_type is not "
                                           "\"text_time\"): a Stable Diffusion 1.x/2.x folder, which "
                                           "StableDiffusionPipeline runs");
  KILN_CHECK(uc.cross_attention_dim == one.hidden_size + two.hidden_size,
             pipe.path_ << ": unet cross_attention_dim " << uc.cross_attention_dim
                        << " is not the text encoders' hidden sizes " << one.hidden_size << " + "
                        << two.hidden_size);
  KILN_CHECK(uc.projection_class_embeddings_input_dim == 6 * uc.addition_time_embed_dim + two.projection_dim,
             pipe.path_ << ": unet projection_class_embeddings_input_dim "
                        << uc.projection_class_embeddings_input_dim << " is not 6 * addition_time_embed_dim ("
                        << uc.addition_time_embed_dim << ") + text_encoder_2's projection_dim ("
                        << two.projection_dim
                        << "): the SDXL base's time ids (a refiner's aesthetic score is not run yet)");
  KILN_CHECK(
      uc.in_channels == pipe.vae_->config().latent_channels,
      pipe.path_ << ": unet in_channels " << uc.in_channels << " is not the vae's latent_channels "
                 << pipe.vae_->config().latent_channels
                 << (uc.in_channels == 9 ? " (a 9-channel inpainting UNet, which Kiln does not run yet)"
                                         : ""));
}

StableDiffusionXLPipeline::PromptEmbeddings StableDiffusionXLPipeline::encode_prompt(
    const std::vector<std::string>& prompts, const std::vector<std::string>& prompts_2, int clip_skip) const {
  const auto tower = [&](const tokenizers::ClipTokenizer& tokenizer, const models::ClipTextModel& encoder,
                         const std::vector<std::string>& texts) {
    const int64_t length = tokenizer.model_max_length();
    tokenizers::EncodeOptions options;
    options.max_length = length;
    std::vector<int64_t> ids;
    for (const std::string& text : texts) {
      if (static_cast<int64_t>(tokenizer.tokenize(text).size()) + 2 > length)
        warn("the prompt is longer than CLIP's " + std::to_string(length) + " tokens and was truncated");
      const std::vector<int64_t> row = tokenizer.encode(text, options).ids;
      ids.insert(ids.end(), row.begin(), row.end());
    }
    return encoder.forward(Tensor::from_vector(ids, {static_cast<int64_t>(texts.size()), length}), true);
  };
  const models::ClipTextOutput a = tower(*tokenizer_, *text_encoder_, prompts);
  const models::ClipTextOutput b = tower(*tokenizer_2_, *text_encoder_2_, prompts_2);
  // hidden_states[-(clip_skip + 2)]: the penultimate layer, or clip_skip layers before it; no final norm.
  const auto pick = [&](const models::ClipTextOutput& o) {
    return o.hidden_states.at(o.hidden_states.size() - 2 - static_cast<size_t>(clip_skip));
  };
  return {.prompt_embeds = concat({pick(a), pick(b)}, 2).to(dtype_),
          .pooled_prompt_embeds = b.pooled.to(dtype_)};
}

void StableDiffusionXLPipeline::check_loaded_request(const PipelineRequest& request) const {
  const char* name = class_name();
  const int64_t multiple = vae_->config().scale_factor();
  const pipelines::ResolvedRequest r =
      pipelines::resolve_with_image_size(request, defaults(), registered_class().edits_an_image(), multiple);
  pipelines::check_image_size(name, r.height, r.width, multiple);
  pipelines::check_task_inputs(registered_class().task, name, request, r);
  samplers_->check(request);
  pair_or(request.original_size, "original_size", {});
  pair_or(request.target_size, "target_size", {});
  pair_or(request.crops_coords_top_left, "crops_coords_top_left", {});
  pair_or(request.negative_original_size, "negative_original_size", {});
  pair_or(request.negative_target_size, "negative_target_size", {});
  pair_or(request.negative_crops_coords_top_left, "negative_crops_coords_top_left", {});
  if (request.clip_skip) {
    const int64_t layers =
        std::min(text_encoder_->config().num_hidden_layers, text_encoder_2_->config().num_hidden_layers);
    if (*request.clip_skip + 1 >= layers)
      throw RequestError("clip_skip", std::string(name) + ": clip_skip " +
                                          std::to_string(*request.clip_skip) +
                                          " leaves no layer of a text encoder of " + std::to_string(layers));
  }
}

PipelineOutput StableDiffusionXLPipeline::run(const PipelineRequest& request,
                                              const pipelines::CallControl& control) {
  const int64_t multiple = vae_->config().scale_factor();
  const pipelines::ResolvedRequest call =
      pipelines::resolve_with_image_size(request, defaults(), registered_class().edits_an_image(), multiple);
  const int n = request.num_images_per_prompt;
  const std::vector<std::string> prompts = pipelines::prompt_list(request);
  // prompt_2 for the second tower, the prompt when unset or empty.
  std::vector<std::string> prompts_2 = prompts;
  if (request.prompt_2 && !request.prompt_2->empty()) prompts_2.assign(prompts.size(), *request.prompt_2);
  const bool guided = call.guidance_scale > 1.0f;
  if (!guided && pipelines::has_negative_prompt(request))
    warn(std::string(class_name()) +
         ": negative_prompt is ignored when guidance_scale is at most 1, as in diffusers");
  const PromptEmbeddings positive = encode_prompt(prompts, prompts_2, request.clip_skip.value_or(0));
  Tensor context = pipelines::repeat_per_prompt(positive.prompt_embeds, n);
  Tensor pooled = pipelines::repeat_per_prompt(positive.pooled_prompt_embeds, n);
  if (guided) {
    PromptEmbeddings negative;
    if (!pipelines::has_negative_prompt(request) && force_zeros_for_empty_prompt_) {
      // force_zeros_for_empty_prompt: no negative prompt means zero embeddings, not the empty prompt's.
      const auto zeros = [](const Tensor& like) {
        return Tensor::zeros(like.shape(), like.dtype(), like.device());
      };
      negative = {.prompt_embeds = zeros(positive.prompt_embeds),
                  .pooled_prompt_embeds = zeros(positive.pooled_prompt_embeds)};
    } else {
      std::vector<std::string> negatives, negatives_2;
      for (size_t i = 0; i < prompts.size(); ++i) {
        negatives.push_back(pipelines::negative_prompt_of(request, i).value_or(""));
        const bool own = request.negative_prompt_2 && !request.negative_prompt_2->empty();
        negatives_2.push_back(own ? *request.negative_prompt_2 : negatives.back());
      }
      // The negative side always reads the penultimate layer (diffusers applies clip_skip to the prompt
      // only).
      negative = encode_prompt(negatives, negatives_2, 0);
    }
    context = concat({pipelines::repeat_per_prompt(negative.prompt_embeds, n), context}, 0);
    pooled = concat({pipelines::repeat_per_prompt(negative.pooled_prompt_embeds, n), pooled}, 0);
  }
  release_after_use({{"text_encoder", text_encoder_.get()}, {"text_encoder_2", text_encoder_2_.get()}});

  // _get_add_time_ids: original size, crop corner, target size, in the prompt's dtype (as diffusers builds
  // them); the negative side's own when given, else the same.
  const std::vector<int64_t> original =
      pair_or(request.original_size, "original_size", {call.height, call.width});
  const std::vector<int64_t> crop = pair_or(request.crops_coords_top_left, "crops_coords_top_left", {0, 0});
  const std::vector<int64_t> target = pair_or(request.target_size, "target_size", {call.height, call.width});
  const auto time_ids = [&](const std::vector<int64_t>& o, const std::vector<int64_t>& c,
                            const std::vector<int64_t>& t) {
    std::vector<float> ids;
    for (const auto* part : {&o, &c, &t})
      for (int64_t v : *part) ids.push_back(static_cast<float>(v));
    return Tensor::from_vector(ids, {1, 6}).to(dtype_).to(float32);
  };
  const int64_t rows = pipelines::batch_size(request);
  const Tensor positive_ids = time_ids(original, crop, target);
  Tensor add_time_ids = positive_ids.expand({rows, 6}).contiguous();
  if (guided) {
    const Tensor negative_ids =
        time_ids(pair_or(request.negative_original_size, "negative_original_size", original),
                 pair_or(request.negative_crops_coords_top_left, "negative_crops_coords_top_left", crop),
                 pair_or(request.negative_target_size, "negative_target_size", target));
    if (registered_class().task == Task::TextToImage) {
      // StableDiffusionXLPipeline repeats the (negative, positive) pair per image, so that the rows alternate
      // while the latents' batch is all negatives, then all positives: image i's ids are the negative's or
      // the positive's by the parity of its row. Reproduced so the same seed makes diffusers' image (it only
      // shows when negative_* sizes differ from the positive ones).
      std::vector<Tensor> pairs;
      for (int64_t b = 0; b < rows; ++b) {
        pairs.push_back(negative_ids);
        pairs.push_back(positive_ids);
      }
      add_time_ids = concat(pairs, 0);
    } else {
      add_time_ids = concat({negative_ids.expand({rows, 6}), add_time_ids}, 0);
    }
  }

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
                              .added = {.text_embeds = pooled, .time_ids = add_time_ids},
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

std::vector<std::pair<std::string, nn::Module*>> StableDiffusionXLPipeline::components() const {
  return {{"text_encoder", text_encoder_.get()},
          {"text_encoder_2", text_encoder_2_.get()},
          {"unet", unet_.get()},
          {"vae", vae_.get()}};
}

models::LatentCodec& StableDiffusionXLPipeline::latent_codec() const {
  return *vae_;
}

nn::Module& StableDiffusionXLPipeline::denoiser() {
  return *unet_;
}

ActivationEstimate StableDiffusionXLPipeline::estimate_activations(const PipelineRequest& request,
                                                                   const Device& device) const {
  const int64_t multiple = vae_->config().scale_factor();
  const pipelines::ResolvedRequest call =
      pipelines::resolve_with_image_size(request, defaults(), registered_class().edits_an_image(), multiple);
  ActivationEstimate e{.height = call.height, .width = call.width};
  const int64_t batch = pipelines::batch_size(request) * (call.guidance_scale > 1.0f ? 2 : 1);
  e.text_encoders = std::max(pipelines::clip_activation_bytes(text_encoder_->config(), dtype(), device),
                             pipelines::clip_activation_bytes(text_encoder_2_->config(), dtype(), device));
  e.transformer =
      unet_activation_bytes(unet_->config(), batch, call.height / multiple, call.width / multiple, dtype());
  e.vae =
      vae_activation_bytes(*vae_, pipelines::batch_size(request), call.height, call.width, dtype(), device);
  return e;
}

}  // namespace kiln
