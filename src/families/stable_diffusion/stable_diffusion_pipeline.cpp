#include "kiln/families/stable_diffusion/stable_diffusion_pipeline.h"

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

constexpr const char* kSiblings[] = {"StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline",
                                     "StableDiffusionInpaintPipeline"};

}  // namespace

StableDiffusionPipeline::StableDiffusionPipeline() = default;
StableDiffusionPipeline::StableDiffusionPipeline(StableDiffusionPipeline&&) noexcept = default;
StableDiffusionPipeline& StableDiffusionPipeline::operator=(StableDiffusionPipeline&&) noexcept = default;
StableDiffusionPipeline::~StableDiffusionPipeline() = default;
StableDiffusionPipeline::StableDiffusionPipeline(const StableDiffusionPipeline& pipe, SharingComponents)
    : UNetPipeline(pipe, SharingComponents{}),
      tokenizer_(pipe.tokenizer_),
      text_encoder_(pipe.text_encoder_) {}

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
  load(pipe, model, options, kSiblings[0]);
  return pipe;
}

StableDiffusionImg2ImgPipeline StableDiffusionImg2ImgPipeline::from_pretrained(
    const std::string& model, const PipelineLoadOptions& options) {
  StableDiffusionImg2ImgPipeline pipe;
  load(pipe, model, options, kSiblings[1]);
  return pipe;
}

StableDiffusionInpaintPipeline StableDiffusionInpaintPipeline::from_pretrained(
    const std::string& model, const PipelineLoadOptions& options) {
  StableDiffusionInpaintPipeline pipe;
  load(pipe, model, options, kSiblings[2]);
  return pipe;
}

PipelineDefaults StableDiffusionPipeline::family_defaults() const {
  return {.height = default_image_size(),
          .width = default_image_size(),
          .num_inference_steps = 50,
          .guidance_scale = 7.5f};
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
  pipe.begin_loading(folder, model, options, pipeline_class, "SD1.x");
  ExecutionScope loading_in(pipe.context());
  pipe.tokenizer_ = std::make_shared<tokenizers::ClipTokenizer>(tokenizers::ClipTokenizer::from_directory(
      folder.need("tokenizer", {"CLIPTokenizer", "CLIPTokenizerFast"})));
  folder.loaded("tokenizer");
  pipe.text_encoder_ =
      models::load_clip_text_model(folder.need("text_encoder", {"CLIPTextModel"}), options.dtype,
                                   pipe.single_file_component("text_encoder"));
  folder.loaded("text_encoder");
  pipe.finish_loading_unet(folder, options);
  const auto& uc = pipe.unet_->config();
  KILN_CHECK(!uc.text_time(), pipe.path_
                                  << ": the UNet takes SDXL's added conditions (addition_embed_type "
                                     "\"text_time\"): an SDXL folder, which StableDiffusionXLPipeline runs");
  KILN_CHECK(uc.cross_attention_dim == pipe.text_encoder_->config().hidden_size,
             pipe.path_ << ": unet cross_attention_dim " << uc.cross_attention_dim
                        << " does not match text_encoder hidden_size "
                        << pipe.text_encoder_->config().hidden_size);
}

Tensor StableDiffusionPipeline::tokenize(const std::vector<std::string>& prompts) const {
  return clip_input_ids(*tokenizer_, prompts);
}

Tensor StableDiffusionPipeline::encode_prompt(const std::vector<std::string>& prompts, int clip_skip) const {
  const models::ClipTextOutput o = text_encoder_->forward(tokenize(prompts), clip_skip > 0);
  if (clip_skip == 0) return o.last_hidden_state.to(dtype_);
  // hidden_states[-(clip_skip + 1)], through the final layer norm (diffusers applies it by hand).
  const auto index = static_cast<int64_t>(o.hidden_states.size()) - 1 - clip_skip;
  return text_encoder_->final_layer_norm(o.hidden_states.at(static_cast<size_t>(index))).to(dtype_);
}

void StableDiffusionPipeline::check_loaded_request(const PipelineRequest& request) const {
  check_unet_request(request);
  if (request.clip_skip) {
    const int64_t layers = text_encoder_->config().num_hidden_layers;
    if (*request.clip_skip >= layers)
      throw RequestError("clip_skip", std::string(class_name()) + ": clip_skip " +
                                          std::to_string(*request.clip_skip) +
                                          " leaves no layer of the text encoder's " + std::to_string(layers));
  }
}

PipelineOutput StableDiffusionPipeline::run(const PipelineRequest& request,
                                            const pipelines::CallControl& control) {
  const pipelines::ResolvedRequest call = resolved(request);
  const int n = request.num_images_per_prompt;
  const std::vector<std::string> prompts = pipelines::prompt_list(request);
  // encode: classifier-free guidance when guidance_scale > 1, with "" as the negative prompt when none is
  // given.
  UNetConditioning conditioning{.guided = call.guidance_scale > 1.0f};
  if (!conditioning.guided && pipelines::has_negative_prompt(request))
    warn(std::string(class_name()) +
         ": negative_prompt is ignored when guidance_scale is at most 1, as in diffusers");
  conditioning.context =
      pipelines::repeat_per_prompt(encode_prompt(prompts, request.clip_skip.value_or(0)), n);
  if (conditioning.guided) {
    std::vector<std::string> negatives;
    for (size_t i = 0; i < prompts.size(); ++i)
      negatives.push_back(pipelines::negative_prompt_of(request, i).value_or(""));
    // The negative side reads the last layer whatever clip_skip says (diffusers applies it to the prompt
    // only).
    conditioning.context =
        concat({pipelines::repeat_per_prompt(encode_prompt(negatives, 0), n), conditioning.context}, 0);
  }
  release_after_use({{"text_encoder", text_encoder_.get()}});
  return run_unet(request, control, conditioning);
}

std::vector<std::pair<std::string, nn::Module*>> StableDiffusionPipeline::components() const {
  return {{"text_encoder", text_encoder_.get()}, {"unet", unet_.get()}, {"vae", vae_.get()}};
}

ActivationEstimate StableDiffusionPipeline::estimate_activations(const PipelineRequest& request,
                                                                 const Device& device) const {
  ActivationEstimate e = unet_activations(request, device);
  e.text_encoders = pipelines::clip_activation_bytes(text_encoder_->config(), dtype(), device);
  return e;
}

}  // namespace kiln
