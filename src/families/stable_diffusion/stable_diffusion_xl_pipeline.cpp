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
      force_zeros_for_empty_prompt_(pipe.force_zeros_for_empty_prompt_),
      requires_aesthetics_score_(pipe.requires_aesthetics_score_) {}

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
  // The refiner (stabilityai/stable-diffusion-xl-refiner-1.0) has no first tower: its folder names
  // text_encoder and tokenizer null, as diffusers' img2img and inpainting pipelines accept.
  const bool first_tower = folder.present("text_encoder");
  KILN_CHECK(first_tower == folder.present("tokenizer"),
             folder.index().path << ": "
                                 << (first_tower ? "text_encoder without its tokenizer"
                                                 : "a tokenizer without its text_encoder")
                                 << "; an SDXL folder has both (base) or neither (the refiner)");
  folder.set_component_count(first_tower ? 7 : 5);
  const auto& index = folder.index().raw;
  pipe.force_zeros_for_empty_prompt_ = index.get_or<bool>("force_zeros_for_empty_prompt", true);
  pipe.requires_aesthetics_score_ = index.get_or<bool>("requires_aesthetics_score", false);
  // A single file must be of the folder's kind, checked first: a base file given the refiner's configs is
  // told so, not that the refiner's text-to-image class is refused.
  pipe.begin_loading(folder, model, options, pipeline_class,
                     pipe.requires_aesthetics_score_ ? "SDXL refiner" : "SDXL");
  KILN_CHECK(!pipe.requires_aesthetics_score_ || std::string(pipeline_class) != kSiblings[0],
             folder.index().path
                 << ": an SDXL refiner (requires_aesthetics_score: its UNet is conditioned on an aesthetic "
                    "score, not a target size); it refines an image, as diffusers' "
                 << kSiblings[1] << " and " << kSiblings[2]
                 << " run it: give an image (kiln generate --init-image), and a mask to inpaint");
  ExecutionScope loading_in(pipe.context());
  if (first_tower) {
    pipe.tokenizer_ = std::make_shared<tokenizers::ClipTokenizer>(tokenizers::ClipTokenizer::from_directory(
        folder.need("tokenizer", {"CLIPTokenizer", "CLIPTokenizerFast"})));
    folder.loaded("tokenizer");
  }
  pipe.tokenizer_2_ = std::make_shared<tokenizers::ClipTokenizer>(tokenizers::ClipTokenizer::from_directory(
      folder.need("tokenizer_2", {"CLIPTokenizer", "CLIPTokenizerFast"})));
  folder.loaded("tokenizer_2");
  if (first_tower) {
    pipe.text_encoder_ =
        models::load_clip_text_model(folder.need("text_encoder", {"CLIPTextModel"}), options.dtype,
                                     pipe.single_file_component("text_encoder"));
    folder.loaded("text_encoder");
  }
  pipe.text_encoder_2_ =
      models::load_clip_text_model(folder.need("text_encoder_2", {"CLIPTextModelWithProjection"}),
                                   options.dtype, pipe.single_file_component("text_encoder_2"));
  folder.loaded("text_encoder_2");
  pipe.finish_loading_unet(folder, options);
  pipe.check_conditioning_widths();
}

void StableDiffusionXLPipeline::check_conditioning_widths() const {
  const auto& uc = unet_->config();
  const auto& two = text_encoder_2_->config();
  KILN_CHECK(two.with_projection, path_ << ": text_encoder_2 must be a CLIPTextModelWithProjection");
  KILN_CHECK(uc.text_time(), path_ << ": the UNet takes no added conditions (addition_embed_type is not "
                                      "\"text_time\"): a Stable Diffusion 1.x/2.x folder, which "
                                      "StableDiffusionPipeline runs");
  const int64_t first = text_encoder_ ? text_encoder_->config().hidden_size : 0;
  KILN_CHECK(uc.cross_attention_dim == first + two.hidden_size,
             path_ << ": unet cross_attention_dim " << uc.cross_attention_dim << " is not the text encoders' "
                   << (text_encoder_ ? "hidden sizes " + std::to_string(first) + " + " : "hidden size ")
                   << two.hidden_size);
  // The added conditions: the pooled projection and time_id_count() numbers, each addition_time_embed_dim
  // wide. A UNet one number off the folder's choice is the other kind (base: 6 ids, refiner: 5).
  const int64_t width = uc.addition_time_embed_dim, pooled = two.projection_dim;
  const int64_t ids = time_id_count();
  if (uc.projection_class_embeddings_input_dim == ids * width + pooled) return;
  const char* what = requires_aesthetics_score_
                         ? "an aesthetic score (5 time ids: original size, crop corner, aesthetic score)"
                         : "the SDXL base's 6 time ids (original size, crop corner, target size)";
  KILN_CHECK(uc.projection_class_embeddings_input_dim != (11 - ids) * width + pooled,
             path_ << ": model_index.json's requires_aesthetics_score is "
                   << (requires_aesthetics_score_ ? "true" : "false") << ", so the UNet gets " << what
                   << ", but its projection_class_embeddings_input_dim "
                   << uc.projection_class_embeddings_input_dim << " takes " << (11 - ids)
                   << " time ids: set requires_aesthetics_score to "
                   << (requires_aesthetics_score_ ? "false" : "true"));
  KILN_CHECK(false, path_ << ": unet projection_class_embeddings_input_dim "
                          << uc.projection_class_embeddings_input_dim << " is not " << ids
                          << " * addition_time_embed_dim (" << width
                          << ") + text_encoder_2's projection_dim (" << pooled
                          << "), the added conditions of " << what);
}

StableDiffusionXLPipeline::PromptEmbeddings StableDiffusionXLPipeline::encode_prompt(
    const std::vector<std::string>& prompts, const std::vector<std::string>& prompts_2, int clip_skip) const {
  // hidden_states[-(clip_skip + 2)]: the penultimate layer, or clip_skip layers before it; no final norm.
  const auto pick = [&](const models::ClipTextOutput& o) {
    return o.hidden_states.at(o.hidden_states.size() - 2 - static_cast<size_t>(clip_skip));
  };
  if (!text_encoder_) {
    // The refiner: diffusers pairs [prompt, prompt_2] with its one tower, so the second tower reads the
    // prompt and prompt_2 goes unread.
    const models::ClipTextOutput b = text_encoder_2_->forward(clip_input_ids(*tokenizer_2_, prompts), true);
    return {.prompt_embeds = pick(b).to(dtype_), .pooled_prompt_embeds = b.pooled.to(dtype_)};
  }
  const models::ClipTextOutput a = text_encoder_->forward(clip_input_ids(*tokenizer_, prompts), true);
  const models::ClipTextOutput b = text_encoder_2_->forward(clip_input_ids(*tokenizer_2_, prompts_2), true);
  return {.prompt_embeds = concat({pick(a), pick(b)}, 2).to(dtype_),
          .pooled_prompt_embeds = b.pooled.to(dtype_)};
}

void StableDiffusionXLPipeline::check_loaded_request(const PipelineRequest& request) const {
  check_unet_request(request);
  if (requires_aesthetics_score_ && registered_class().task == Task::TextToImage)
    throw RequestError("image",
                       std::string(class_name()) +
                           ": an SDXL refiner (its UNet is conditioned on an aesthetic score) refines "
                           "an image: run it as StableDiffusionXLImg2ImgPipeline or "
                           "StableDiffusionXLInpaintPipeline");
  add_time_ids(request, true);  // the size pairs' lengths
  if (request.clip_skip) {
    int64_t layers = text_encoder_2_->config().num_hidden_layers;
    if (text_encoder_) layers = std::min(layers, text_encoder_->config().num_hidden_layers);
    if (*request.clip_skip + 1 >= layers)
      throw RequestError("clip_skip", std::string(class_name()) + ": clip_skip " +
                                          std::to_string(*request.clip_skip) +
                                          " leaves no layer of a text encoder of " + std::to_string(layers));
  }
}

int64_t StableDiffusionXLPipeline::time_id_count() const {
  return requires_aesthetics_score_ ? 5 : 6;
}

Tensor StableDiffusionXLPipeline::add_time_ids(const PipelineRequest& request, bool guided) const {
  const pipelines::ResolvedRequest call = resolved(request);
  const std::vector<int64_t> original =
      pair_or(request.original_size, "original_size", {call.height, call.width});
  const std::vector<int64_t> crop = pair_or(request.crops_coords_top_left, "crops_coords_top_left", {0, 0});
  const std::vector<int64_t> target = pair_or(request.target_size, "target_size", {call.height, call.width});
  const std::vector<int64_t> negative_original =
      pair_or(request.negative_original_size, "negative_original_size", original);
  const std::vector<int64_t> negative_crop =
      pair_or(request.negative_crops_coords_top_left, "negative_crops_coords_top_left", {0, 0});
  const std::vector<int64_t> negative_target =
      pair_or(request.negative_target_size, "negative_target_size", target);
  const bool text_to_image = registered_class().task == Task::TextToImage;
  const auto as_floats = [](std::initializer_list<const std::vector<int64_t>*> parts) {
    std::vector<float> values;
    for (const auto* part : parts)
      for (int64_t v : *part) values.push_back(static_cast<float>(v));
    return values;
  };
  // diffusers' _get_add_time_ids, whose negative side differs by class: the refiner's reads the negative crop
  // corner (default (0, 0)) and score; the base's image-to-image and inpainting read the positive crop corner
  // for both sides; its text-to-image takes the negative sizes only as a pair, the positive ids otherwise.
  std::vector<float> positive, negative;
  if (requires_aesthetics_score_) {
    positive = as_floats({&original, &crop});
    positive.push_back(request.aesthetic_score.value_or(6.0f));
    negative = as_floats({&negative_original, &negative_crop});
    negative.push_back(request.negative_aesthetic_score.value_or(2.5f));
  } else {
    positive = as_floats({&original, &crop, &target});
    if (!text_to_image)
      negative = as_floats({&negative_original, &crop, &negative_target});
    else if (!request.negative_original_size.empty() && !request.negative_target_size.empty())
      negative = as_floats({&negative_original, &negative_crop, &negative_target});
    else
      negative = positive;
  }
  const int64_t columns = time_id_count();
  // In the prompt's dtype, as diffusers builds them.
  const auto row = [&](const std::vector<float>& values) {
    return Tensor::from_vector(values, {1, columns}).to(dtype_).to(float32);
  };
  const int64_t rows = pipelines::batch_size(request);
  if (!guided) return row(positive).expand({rows, columns}).contiguous();
  if (!text_to_image)
    return concat({row(negative).expand({rows, columns}), row(positive).expand({rows, columns})}, 0)
        .contiguous();
  // StableDiffusionXLPipeline repeats the (negative, positive) pair per image, so that its rows alternate
  // while the latents' batch is all negatives, then all positives: an image's ids are the negative's or the
  // positive's by the parity of its row. Reproduced so the same seed makes diffusers' image (it only shows
  // when the negative_* sizes differ from the positive ones).
  std::vector<Tensor> pairs;
  for (int64_t b = 0; b < rows; ++b) {
    pairs.push_back(row(negative));
    pairs.push_back(row(positive));
  }
  return concat(pairs, 0);
}

void StableDiffusionXLPipeline::warn_unread_fields(const PipelineRequest& request) const {
  const std::string self = class_name();
  const bool text_to_image = registered_class().task == Task::TextToImage;
  if (!requires_aesthetics_score_ && (request.aesthetic_score || request.negative_aesthetic_score))
    warn(self +
         ": aesthetic_score and negative_aesthetic_score are not read: the folder's UNet takes no "
         "aesthetic score (requires_aesthetics_score is false: an SDXL base, not the refiner)");
  if (requires_aesthetics_score_ && (!request.target_size.empty() || !request.negative_target_size.empty()))
    warn(self +
         ": target_size and negative_target_size are not read: the refiner's time ids hold an "
         "aesthetic score in their place");
  if (!requires_aesthetics_score_ && !text_to_image && !request.negative_crops_coords_top_left.empty())
    warn(self + ": negative_crops_coords_top_left is not read: diffusers' " + self +
         " gives the negative side crops_coords_top_left (only the refiner reads a negative crop corner)");
  if (text_to_image && (request.negative_original_size.empty() != request.negative_target_size.empty()))
    warn(self +
         ": negative_original_size and negative_target_size are read only together, as in diffusers; "
         "with one of them, the negative side takes the positive time ids");
  if (!text_encoder_ && request.prompt_2 && !request.prompt_2->empty())
    warn(self + ": prompt_2 is not read: the refiner's one text encoder reads the prompt, as in diffusers");
}

PipelineOutput StableDiffusionXLPipeline::run(const PipelineRequest& request,
                                              const pipelines::CallControl& control) {
  const pipelines::ResolvedRequest call = resolved(request);
  warn_unread_fields(request);
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
  e.text_encoders = pipelines::clip_activation_bytes(text_encoder_2_->config(), dtype(), device);
  if (text_encoder_)
    e.text_encoders =
        std::max(e.text_encoders, pipelines::clip_activation_bytes(text_encoder_->config(), dtype(), device));
  return e;
}

}  // namespace kiln
