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
  return edit_image_size(kImageArea, width, height);
}

Image QwenImageEditPipeline::resized(const Image& image) {
  return edit_resized(image, kImageArea);
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
  return tokenize_with_images(template_prompt(prompt), image_grids({image}));
}

std::pair<Tensor, Tensor> QwenImageEditPipeline::encode_prompt(const std::vector<std::string>& prompts,
                                                               const Image& image, int n,
                                                               int64_t max_sequence_length) const {
  return encode_prompt_with_images(prompts, {image}, template_prompt, n, max_sequence_length);
}

void QwenImageEditPipeline::check_loaded_request(const PipelineRequest& request) const {
  const std::string name = class_name();
  pipelines::refuse(request.image.empty(), "image", name + ": an edit needs the image to edit (image)");
  pipelines::refuse(request.image.size() > 1, "image",
                    name + " edits one image, got " + std::to_string(request.image.size()));
  check_edit_images(request);
  check_call(request, resolve_call(request));
}

PipelineOutput QwenImageEditPipeline::run(const PipelineRequest& request,
                                          const pipelines::CallControl& control) {
  const pipelines::ResolvedRequest call = resolve_call(request);
  const Image image = resized(request.image.front());
  const CallText text = encode_call(request, [&](const std::vector<std::string>& prompts) {
    return encode_prompt(prompts, image, request.num_images_per_prompt, call.max_sequence_length);
  });
  // The image's latents beside the noise's tokens of every image of the call.
  const auto [context, shapes] = image_context({image}, text.embeds.dtype(), pipelines::batch_size(request));
  return denoise(request, call, text, context, shapes, control);
}

}  // namespace kiln
