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
  return edit_image_size(area, width, height);
}

Image QwenImageEditPlusPipeline::resized(const Image& image, int64_t area) {
  return edit_resized(image, area);
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
  return tokenize_with_images(template_prompt(prompt, images.size()), image_grids(images));
}

std::pair<Tensor, Tensor> QwenImageEditPlusPipeline::encode_prompt(const std::vector<std::string>& prompts,
                                                                   const std::vector<Image>& images, int n,
                                                                   int64_t max_sequence_length) const {
  return encode_prompt_with_images(
      prompts, images, [&](const std::string& prompt) { return template_prompt(prompt, images.size()); }, n,
      max_sequence_length);
}

void QwenImageEditPlusPipeline::check_loaded_request(const PipelineRequest& request) const {
  const std::string name = class_name();
  pipelines::refuse(request.image.empty(), "image", name + ": an edit needs at least one image (image)");
  check_edit_images(request);
  // diffusers: "currently only supports batch_size=1" (num_images_per_prompt is free).
  pipelines::refuse(request.prompts.size() > 1, "prompts",
                    name + " takes one prompt a call, got " + std::to_string(request.prompts.size()));
  check_call(request, resolve_call(request));
}

PipelineOutput QwenImageEditPlusPipeline::run(const PipelineRequest& request,
                                              const pipelines::CallControl& control) {
  const pipelines::ResolvedRequest call = resolve_call(request);
  // Each image resized from the original twice: for Qwen2.5-VL and for the VAE.
  std::vector<Image> condition_images, vae_images;
  for (const Image& image : request.image) {
    condition_images.push_back(resized(image, kConditionArea));
    vae_images.push_back(resized(image, kVaeArea));
  }
  const CallText text = encode_call(request, [&](const std::vector<std::string>& prompts) {
    return encode_prompt(prompts, condition_images, request.num_images_per_prompt, call.max_sequence_length);
  });
  // Each image's latents beside the noise's tokens of every image of the call, one image after another.
  const auto [context, shapes] =
      image_context(vae_images, text.embeds.dtype(), pipelines::batch_size(request));
  return denoise(request, call, text, context, shapes, control);
}

}  // namespace kiln
