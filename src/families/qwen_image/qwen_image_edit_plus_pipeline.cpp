#include "kiln/families/qwen_image/qwen_image_edit_plus_pipeline.h"

#include <algorithm>
#include <cmath>

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

// Every image read by the processor: the patches of all, one after another, and each one's grid.
struct ProcessedImages {
  Tensor pixel_values;
  std::vector<models::ImageGrid> grids;
};

ProcessedImages process(const std::vector<Image>& images, const models::Qwen2VLImageProcessorConfig& config) {
  ProcessedImages out;
  std::vector<Tensor> pixels;
  for (const Image& image : images) {
    models::QwenVLImageInput input = models::qwen2_vl_preprocess(image, config);
    pixels.push_back(std::move(input.pixel_values));
    out.grids.push_back(input.grid);
  }
  out.pixel_values = pixels.size() == 1 ? pixels.front() : concat(pixels, 0);
  return out;
}

}  // namespace

QwenImageEditPlusPipeline::QwenImageEditPlusPipeline() = default;
QwenImageEditPlusPipeline::QwenImageEditPlusPipeline(QwenImageEditPlusPipeline&&) noexcept = default;
QwenImageEditPlusPipeline& QwenImageEditPlusPipeline::operator=(QwenImageEditPlusPipeline&&) noexcept =
    default;
QwenImageEditPlusPipeline::~QwenImageEditPlusPipeline() = default;

QwenImageEditPlusPipeline QwenImageEditPlusPipeline::from_pretrained(const std::string& model,
                                                                     const PipelineLoadOptions& options) {
  QwenImageEditPlusPipeline pipe;
  load(pipe, model, options, "QwenImageEditPlusPipeline");
  return pipe;
}

std::string QwenImageEditPlusPipeline::template_prompt(const std::string& prompt, size_t images) {
  std::string pictures;
  for (size_t k = 1; k <= images; ++k)
    pictures += "Picture " + std::to_string(k) + ": <|vision_start|><|image_pad|><|vision_end|>";
  return "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
         "objects, background), then explain how the user's text instruction should alter or modify the "
         "image. Generate a new image that meets the user's requirements while maintaining consistency with "
         "the original input where appropriate.<|im_end|>\n<|im_start|>user\n" +
         pictures + prompt + "<|im_end|>\n<|im_start|>assistant\n";
}

std::pair<int64_t, int64_t> QwenImageEditPlusPipeline::image_size(int64_t area, int64_t width,
                                                                  int64_t height) {
  // As Python computes it: the ratio, then sqrt(area * ratio) and its quotient by the ratio, each side
  // rounded (halves to even: nearbyint in the default rounding mode) to a multiple of 32.
  const double ratio = static_cast<double>(width) / static_cast<double>(height);
  const double w = std::sqrt(static_cast<double>(area) * ratio);
  const double h = w / ratio;
  return {static_cast<int64_t>(std::nearbyint(w / 32)) * 32,
          static_cast<int64_t>(std::nearbyint(h / 32)) * 32};
}

Image QwenImageEditPlusPipeline::resized(const Image& image, int64_t area) {
  const auto [width, height] = image_size(area, image.width, image.height);
  if (image.width == width && image.height == height) return image;  // PIL's resize to its own size: a copy
  return pipelines::resize_lanczos(image, static_cast<int>(width), static_cast<int>(height));
}

pipelines::ResolvedRequest QwenImageEditPlusPipeline::resolve_call(const PipelineRequest& request) const {
  pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  if (!request.image.empty()) {
    const Image& last = request.image.back();
    const auto [width, height] = image_size(kVaeArea, last.width, last.height);
    if (!request.height) call.height = height;
    if (!request.width) call.width = width;
  }
  return call;
}

std::vector<int64_t> QwenImageEditPlusPipeline::tokenize(const std::string& prompt,
                                                         const std::vector<Image>& images) const {
  std::vector<models::ImageGrid> grids;
  for (const Image& image : images) grids.push_back(models::qwen2_vl_preprocess(image, *processor_).grid);
  const std::string text = models::qwen2_vl_expand_image_tokens(template_prompt(prompt, images.size()), grids,
                                                                text_encoder_->config().spatial_merge_size);
  tokenizers::BpeEncodeOptions options;
  options.truncation = false;  // the processor pads and never cuts
  options.pad_to_max_length = false;
  return tokenizer_->encode(text, options).ids;
}

std::pair<Tensor, Tensor> QwenImageEditPlusPipeline::encode_prompt(const std::vector<std::string>& prompts,
                                                                   const std::vector<Image>& images, int n,
                                                                   int64_t max_sequence_length) const {
  // The images read once by the vision tower (all in one call, each at its own grid); their patch
  // embeddings fill every prompt's image tokens, image k its k-th run.
  const ProcessedImages processed = process(images, *processor_);
  const Tensor embeds = vision_->forward(processed.pixel_values.to(dtype_), processed.grids);
  const models::MultimodalInputs inputs =
      models::multimodal_inputs(text_encoder_->config(), embeds, processed.grids,
                                /*multimodal_positions=*/true);
  std::vector<Tensor> features;
  for (const std::string& prompt : prompts)
    features.push_back(
        prompt_features(tokenize(prompt, images), kEditTemplateTokens, max_sequence_length, &inputs));
  return batched_features(features, n);
}

void QwenImageEditPlusPipeline::check_loaded_request(const PipelineRequest& request) const {
  const std::string name = class_name();
  pipelines::refuse(request.image.empty(), "image", name + ": an edit needs at least one image (image)");
  for (size_t k = 0; k < request.image.size(); ++k) {
    const Image& image = request.image[k];
    const double ratio = static_cast<double>(std::max(image.width, image.height)) /
                         static_cast<double>(std::max<int64_t>(1, std::min(image.width, image.height)));
    pipelines::refuse(image.width < 1 || image.height < 1 || ratio > kMaxAspectRatio, "image",
                      name + ": image " + std::to_string(k) + " is " + std::to_string(image.width) + "x" +
                          std::to_string(image.height) +
                          "; Qwen2.5-VL reads images whose sides are at most " +
                          std::to_string(static_cast<int>(kMaxAspectRatio)) + " times one another");
  }
  // diffusers: "currently only supports batch_size=1" (num_images_per_prompt is free).
  pipelines::refuse(request.prompts.size() > 1, "prompts",
                    name + " takes one prompt a call, got " + std::to_string(request.prompts.size()));
  const pipelines::ResolvedRequest r = resolve_call(request);
  pipelines::check_image_size(name.c_str(), r.height, r.width, vae_->config().scale_factor() * 2);
  pipelines::check_task_inputs(registered_class().task, name.c_str(), request, r);
  if (r.max_sequence_length > kMaxSequenceLength)
    throw RequestError("max_sequence_length", name + ": max_sequence_length " +
                                                  std::to_string(r.max_sequence_length) +
                                                  " is more than the " + std::to_string(kMaxSequenceLength) +
                                                  " tokens Qwen-Image reads");
}

PipelineOutput QwenImageEditPlusPipeline::run(const PipelineRequest& request,
                                              const pipelines::CallControl& control) {
  const pipelines::ResolvedRequest call = resolve_call(request);
  // Each image resized from the original twice: for Qwen2.5-VL and for the VAE.
  std::vector<Image> condition_images;
  for (const Image& image : request.image) condition_images.push_back(resized(image, kConditionArea));
  const CallText text = encode_call(request, [&](const std::vector<std::string>& prompts) {
    return encode_prompt(prompts, condition_images, request.num_images_per_prompt, call.max_sequence_length);
  });
  // Each image's latents (the posterior's mode, normalised), packed, for every image of the call; the
  // images' tokens one after another, each at its own grid.
  const int64_t batch = pipelines::batch_size(request);
  const int64_t multiple = vae_->config().scale_factor() * 2;
  std::vector<Tensor> packed;
  std::vector<models::QwenImageShape> shapes;
  for (const Image& original : request.image) {
    const Image image = resized(original, kVaeArea);
    const Tensor pixels = pipelines::preprocess_image(image, image.height, image.width);
    const Tensor encoded = pipelines::encode_image(*vae_, pixels, text.embeds.dtype(), nullptr);
    const Tensor repeated =
        batch > 1 ? concat(std::vector<Tensor>(static_cast<size_t>(batch), encoded), 0) : encoded;
    packed.push_back(models::flux_pack_latents(repeated));
    shapes.push_back({.frames = 1, .height = image.height / multiple, .width = image.width / multiple});
  }
  const Tensor context = packed.size() == 1 ? packed.front() : concat(packed, 1);
  return denoise(request, call, text, context, shapes, control);
}

std::vector<std::pair<std::string, nn::Module*>> QwenImageEditPlusPipeline::components() const {
  std::vector<std::pair<std::string, nn::Module*>> out = QwenImagePipeline::components();
  out.insert(out.begin() + 1, {"vision_encoder", vision_.get()});
  return out;
}

}  // namespace kiln
