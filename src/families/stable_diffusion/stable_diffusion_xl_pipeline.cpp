#include "kiln/families/stable_diffusion/stable_diffusion_xl_pipeline.h"

#include <algorithm>

#include "families/stable_diffusion/clip_prompts.h"
#include "kiln/core/log.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/ops.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/tokenizers/clip_tokenizer.h"
#include "pipelines/encoder_activations.h"
#include "pipelines/pipeline_common.h"

namespace kiln {

namespace {

constexpr const char* kSiblings[] = {"StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline",
                                     "StableDiffusionXLInpaintPipeline"};

// A (height, width)-like pair of the request, or `fallback` when unset; RequestError unless it has 2 values.
std::vector<int64_t> pair_or(const std::vector<int64_t>& given, const char* field,
                             std::vector<int64_t> fallback) {
  if (given.empty()) return fallback;
  if (given.size() != 2)
    throw RequestError(
        field, std::string(field) + " takes 2 values (" +
                   (std::string(field).find("crops") != std::string::npos ? "top, left" : "height, width") +
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
    : UNetPipeline(pipe, SharingComponents{}),
      tokenizer_(pipe.tokenizer_),
      tokenizer_2_(pipe.tokenizer_2_),
      text_encoder_(pipe.text_encoder_),
      text_encoder_2_(pipe.text_encoder_2_),
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
  return {.height = default_image_size(),
          .width = default_image_size(),
          .num_inference_steps = 50,
          .guidance_scale = 5.0f};
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
             folder.index().path << ": no text_encoder: an SDXL refiner folder (text_encoder_2 alone, "
                                    "aesthetic-score conditioning), which Kiln does not run yet");
  folder.set_component_count(7);
  pipe.force_zeros_for_empty_prompt_ = folder.index().raw.get_or<bool>("force_zeros_for_empty_prompt", true);
  pipe.begin_loading(folder, model, options, pipeline_class, "SDXL");
  ExecutionScope loading_in(pipe.context());
  for (const char* name : {"tokenizer", "tokenizer_2"}) {
    (name == std::string("tokenizer") ? pipe.tokenizer_ : pipe.tokenizer_2_) =
        std::make_shared<tokenizers::ClipTokenizer>(tokenizers::ClipTokenizer::from_directory(
            folder.need(name, {"CLIPTokenizer", "CLIPTokenizerFast"})));
    folder.loaded(name);
  }
  pipe.text_encoder_ =
      models::load_clip_text_model(folder.need("text_encoder", {"CLIPTextModel"}), options.dtype,
                                   pipe.single_file_component("text_encoder"));
  folder.loaded("text_encoder");
  pipe.text_encoder_2_ =
      models::load_clip_text_model(folder.need("text_encoder_2", {"CLIPTextModelWithProjection"}),
                                   options.dtype, pipe.single_file_component("text_encoder_2"));
  folder.loaded("text_encoder_2");
  pipe.finish_loading_unet(folder, options);
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
}

StableDiffusionXLPipeline::PromptEmbeddings StableDiffusionXLPipeline::encode_prompt(
    const std::vector<std::string>& prompts, const std::vector<std::string>& prompts_2, int clip_skip) const {
  const models::ClipTextOutput a = text_encoder_->forward(clip_input_ids(*tokenizer_, prompts), true);
  const models::ClipTextOutput b = text_encoder_2_->forward(clip_input_ids(*tokenizer_2_, prompts_2), true);
  // hidden_states[-(clip_skip + 2)]: the penultimate layer, or clip_skip layers before it; no final norm.
  const auto pick = [&](const models::ClipTextOutput& o) {
    return o.hidden_states.at(o.hidden_states.size() - 2 - static_cast<size_t>(clip_skip));
  };
  return {.prompt_embeds = concat({pick(a), pick(b)}, 2).to(dtype_),
          .pooled_prompt_embeds = b.pooled.to(dtype_)};
}

void StableDiffusionXLPipeline::check_loaded_request(const PipelineRequest& request) const {
  check_unet_request(request);
  add_time_ids(request, true);  // the size pairs' lengths
  if (request.clip_skip) {
    const int64_t layers =
        std::min(text_encoder_->config().num_hidden_layers, text_encoder_2_->config().num_hidden_layers);
    if (*request.clip_skip + 1 >= layers)
      throw RequestError("clip_skip", std::string(class_name()) + ": clip_skip " +
                                          std::to_string(*request.clip_skip) +
                                          " leaves no layer of a text encoder of " + std::to_string(layers));
  }
}

Tensor StableDiffusionXLPipeline::add_time_ids(const PipelineRequest& request, bool guided) const {
  const pipelines::ResolvedRequest call = resolved(request);
  const std::vector<int64_t> original =
      pair_or(request.original_size, "original_size", {call.height, call.width});
  const std::vector<int64_t> crop = pair_or(request.crops_coords_top_left, "crops_coords_top_left", {0, 0});
  const std::vector<int64_t> target = pair_or(request.target_size, "target_size", {call.height, call.width});
  // Original size, crop corner, target size, in the prompt's dtype (as diffusers builds them).
  const auto ids = [&](const std::vector<int64_t>& o, const std::vector<int64_t>& c,
                       const std::vector<int64_t>& t) {
    std::vector<float> values;
    for (const auto* part : {&o, &c, &t})
      for (int64_t v : *part) values.push_back(static_cast<float>(v));
    return Tensor::from_vector(values, {1, 6}).to(dtype_).to(float32);
  };
  const int64_t rows = pipelines::batch_size(request);
  const Tensor positive = ids(original, crop, target);
  if (!guided) return positive.expand({rows, 6}).contiguous();
  const Tensor negative =
      ids(pair_or(request.negative_original_size, "negative_original_size", original),
          pair_or(request.negative_crops_coords_top_left, "negative_crops_coords_top_left", crop),
          pair_or(request.negative_target_size, "negative_target_size", target));
  if (registered_class().task != Task::TextToImage)
    return concat({negative.expand({rows, 6}), positive.expand({rows, 6})}, 0).contiguous();
  // StableDiffusionXLPipeline repeats the (negative, positive) pair per image, so that its rows alternate
  // while the latents' batch is all negatives, then all positives: an image's ids are the negative's or the
  // positive's by the parity of its row. Reproduced so the same seed makes diffusers' image (it only shows
  // when the negative_* sizes differ from the positive ones).
  std::vector<Tensor> pairs;
  for (int64_t b = 0; b < rows; ++b) {
    pairs.push_back(negative);
    pairs.push_back(positive);
  }
  return concat(pairs, 0);
}

PipelineOutput StableDiffusionXLPipeline::run(const PipelineRequest& request,
                                              const pipelines::CallControl& control) {
  const pipelines::ResolvedRequest call = resolved(request);
  const int n = request.num_images_per_prompt;
  const std::vector<std::string> prompts = pipelines::prompt_list(request);
  // prompt_2 for the second tower, the prompt when unset or empty.
  std::vector<std::string> prompts_2 = prompts;
  if (request.prompt_2 && !request.prompt_2->empty()) prompts_2.assign(prompts.size(), *request.prompt_2);
  UNetConditioning conditioning{.guided = call.guidance_scale > 1.0f};
  if (!conditioning.guided && pipelines::has_negative_prompt(request))
    warn(std::string(class_name()) +
         ": negative_prompt is ignored when guidance_scale is at most 1, as in diffusers");
  const PromptEmbeddings positive = encode_prompt(prompts, prompts_2, request.clip_skip.value_or(0));
  Tensor context = pipelines::repeat_per_prompt(positive.prompt_embeds, n);
  Tensor pooled = pipelines::repeat_per_prompt(positive.pooled_prompt_embeds, n);
  if (conditioning.guided) {
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
      const bool own_2 = request.negative_prompt_2 && !request.negative_prompt_2->empty();
      for (size_t i = 0; i < prompts.size(); ++i) {
        negatives.push_back(pipelines::negative_prompt_of(request, i).value_or(""));
        negatives_2.push_back(own_2 ? *request.negative_prompt_2 : negatives.back());
      }
      // The negative side always reads the penultimate layer (diffusers applies clip_skip to the prompt
      // only).
      negative = encode_prompt(negatives, negatives_2, 0);
    }
    context = concat({pipelines::repeat_per_prompt(negative.prompt_embeds, n), context}, 0);
    pooled = concat({pipelines::repeat_per_prompt(negative.pooled_prompt_embeds, n), pooled}, 0);
  }
  release_after_use({{"text_encoder", text_encoder_.get()}, {"text_encoder_2", text_encoder_2_.get()}});
  conditioning.context = context;
  conditioning.added = {.text_embeds = pooled, .time_ids = add_time_ids(request, conditioning.guided)};
  return run_unet(request, control, conditioning);
}

std::vector<std::pair<std::string, nn::Module*>> StableDiffusionXLPipeline::components() const {
  return {{"text_encoder", text_encoder_.get()},
          {"text_encoder_2", text_encoder_2_.get()},
          {"unet", unet_.get()},
          {"vae", vae_.get()}};
}

ActivationEstimate StableDiffusionXLPipeline::estimate_activations(const PipelineRequest& request,
                                                                   const Device& device) const {
  ActivationEstimate e = unet_activations(request, device);
  e.text_encoders = std::max(pipelines::clip_activation_bytes(text_encoder_->config(), dtype(), device),
                             pipelines::clip_activation_bytes(text_encoder_2_->config(), dtype(), device));
  return e;
}

}  // namespace kiln
