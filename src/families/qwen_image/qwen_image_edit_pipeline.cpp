#include "kiln/families/qwen_image/qwen_image_edit_pipeline.h"

#include <algorithm>
#include <cmath>

#include "kiln/core/log.h"
#include "kiln/families/qwen_image/autoencoder_kl_qwen_image.h"
#include "kiln/families/qwen_image/qwen2_vl_image_processor.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/qwen2_5_vl_vision.h"
#include "kiln/ops.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/tokenizers/bpe_tokenizer.h"
#include "pipelines/image_processor.h"
#include "pipelines/pil_resize.h"
#include "pipelines/pipeline_common.h"
#include "pipelines/task_stages.h"

namespace kiln {

namespace {

// The processor's ratio limit (transformers' smart_resize refuses beyond it).
constexpr double kMaxAspectRatio = 200;

}  // namespace

QwenImageEditPipeline::QwenImageEditPipeline() = default;
QwenImageEditPipeline::QwenImageEditPipeline(QwenImageEditPipeline&&) noexcept = default;
QwenImageEditPipeline& QwenImageEditPipeline::operator=(QwenImageEditPipeline&&) noexcept = default;
QwenImageEditPipeline::~QwenImageEditPipeline() = default;

QwenImageEditPipeline QwenImageEditPipeline::from_pretrained(const std::string& model,
                                                             const PipelineLoadOptions& options) {
  QwenImageEditPipeline pipe;
  load(pipe, model, options, "QwenImageEditPipeline");
  return pipe;
}

std::string QwenImageEditPipeline::template_prompt(const std::string& prompt) {
  return "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
         "objects, background), then explain how the user's text instruction should alter or modify the "
         "image. "
         "Generate a new image that meets the user's requirements while maintaining consistency with the "
         "original input where appropriate.<|im_end|>\n<|im_start|>user\n"
         "<|vision_start|><|image_pad|><|vision_end|>" +
         prompt + "<|im_end|>\n<|im_start|>assistant\n";
}

std::pair<int64_t, int64_t> QwenImageEditPipeline::image_size(int64_t width, int64_t height) {
  const double ratio = static_cast<double>(width) / static_cast<double>(height);
  const double w = std::sqrt(1024.0 * 1024.0 * ratio);
  const double h = w / ratio;
  // Python's round(): halves to even, as nearbyint in the default rounding mode.
  return {static_cast<int64_t>(std::nearbyint(w / 32)) * 32,
          static_cast<int64_t>(std::nearbyint(h / 32)) * 32};
}

Image QwenImageEditPipeline::resized(const Image& image) {
  const auto [width, height] = image_size(image.width, image.height);
  if (image.width == width && image.height == height) return image;  // PIL's resize to its own size: a copy
  return pipelines::resize_lanczos(image, static_cast<int>(width), static_cast<int>(height));
}

pipelines::ResolvedRequest QwenImageEditPipeline::resolve_call(const PipelineRequest& request) const {
  pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  if (!request.image.empty()) {
    const auto [width, height] = image_size(request.image.front().width, request.image.front().height);
    if (!request.height) call.height = height;
    if (!request.width) call.width = width;
  }
  return call;
}

std::vector<int64_t> QwenImageEditPipeline::tokenize(const std::string& prompt, const Image& image) const {
  const models::QwenVLImageInput input = models::qwen2_vl_preprocess(image, *processor_);
  const std::string text = models::qwen2_vl_expand_image_tokens(template_prompt(prompt), {input.grid},
                                                                text_encoder_->config().spatial_merge_size);
  tokenizers::BpeEncodeOptions options;
  options.truncation = false;  // the processor pads and never cuts
  options.pad_to_max_length = false;
  return tokenizer_->encode(text, options).ids;
}

std::pair<Tensor, Tensor> QwenImageEditPipeline::encode_prompt(const std::vector<std::string>& prompts,
                                                               const Image& image, int n,
                                                               int64_t max_sequence_length) const {
  // The image read once by the vision tower; its patch embeddings fill every prompt's image tokens.
  const models::QwenVLImageInput input = models::qwen2_vl_preprocess(image, *processor_);
  const Tensor embeds = vision_->forward(input.pixel_values.to(dtype_), {input.grid});
  const models::MultimodalInputs images =
      models::multimodal_inputs(text_encoder_->config(), embeds, {input.grid}, /*multimodal_positions=*/true);
  std::vector<Tensor> features;
  for (const std::string& prompt : prompts)
    features.push_back(
        prompt_features(tokenize(prompt, image), kEditTemplateTokens, max_sequence_length, &images));
  return batched_features(features, n);
}

void QwenImageEditPipeline::check_loaded_request(const PipelineRequest& request) const {
  const std::string name = class_name();
  pipelines::refuse(request.image.empty(), "image", name + ": an edit needs the image to edit (image)");
  pipelines::refuse(request.image.size() > 1, "image",
                    name + " edits one image, got " + std::to_string(request.image.size()));
  const Image& image = request.image.front();
  const double ratio = static_cast<double>(std::max(image.width, image.height)) /
                       static_cast<double>(std::max<int64_t>(1, std::min(image.width, image.height)));
  pipelines::refuse(image.width < 1 || image.height < 1 || ratio > kMaxAspectRatio, "image",
                    name + ": the image is " + std::to_string(image.width) + "x" +
                        std::to_string(image.height) + "; Qwen2.5-VL reads images whose sides are at most " +
                        std::to_string(static_cast<int>(kMaxAspectRatio)) + " times one another");
  const pipelines::ResolvedRequest r = resolve_call(request);
  pipelines::check_image_size(name.c_str(), r.height, r.width, vae_->config().scale_factor() * 2);
  pipelines::check_task_inputs(registered_class().task, name.c_str(), request, r);
  if (r.max_sequence_length > kMaxSequenceLength)
    throw RequestError("max_sequence_length", name + ": max_sequence_length " +
                                                  std::to_string(r.max_sequence_length) +
                                                  " is more than the " + std::to_string(kMaxSequenceLength) +
                                                  " tokens Qwen-Image reads");
}

PipelineOutput QwenImageEditPipeline::run(const PipelineRequest& request,
                                          const pipelines::CallControl& control) {
  const pipelines::ResolvedRequest call = resolve_call(request);
  const Image image = resized(request.image.front());
  const CallText text = encode_call(request, [&](const std::vector<std::string>& prompts) {
    return encode_prompt(prompts, image, request.num_images_per_prompt, call.max_sequence_length);
  });
  // The image's latents (the posterior's mode, normalised), packed beside the noise's tokens of every image
  // of the call.
  const Tensor pixels = pipelines::preprocess_image(image, image.height, image.width);
  const Tensor encoded = pipelines::encode_image(*vae_, pixels, text.embeds.dtype(), nullptr);
  const int64_t batch = pipelines::batch_size(request);
  const Tensor repeated =
      batch > 1 ? concat(std::vector<Tensor>(static_cast<size_t>(batch), encoded), 0) : encoded;
  const int64_t multiple = vae_->config().scale_factor() * 2;
  const models::QwenImageShape shape{
      .frames = 1, .height = image.height / multiple, .width = image.width / multiple};
  return denoise(request, call, text, models::flux_pack_latents(repeated), {shape}, control);
}

std::vector<std::pair<std::string, nn::Module*>> QwenImageEditPipeline::components() const {
  std::vector<std::pair<std::string, nn::Module*>> out = QwenImagePipeline::components();
  out.insert(out.begin() + 1, {"vision_encoder", vision_.get()});
  return out;
}

}  // namespace kiln
