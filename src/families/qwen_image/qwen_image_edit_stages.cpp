// The stages Qwen-Image-Edit and -Edit-2509 share: the images resized, read by Qwen2.5-VL with the prompt,
// and encoded beside the noise.
#include <algorithm>
#include <cmath>

#include "kiln/families/qwen_image/autoencoder_kl_qwen_image.h"
#include "kiln/families/qwen_image/qwen2_vl_image_processor.h"
#include "kiln/families/qwen_image/qwen_image_pipeline.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/qwen2_5_vl_vision.h"
#include "kiln/ops.h"
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

std::pair<int64_t, int64_t> QwenImagePipeline::edit_image_size(int64_t area, int64_t width, int64_t height) {
  // As Python computes it: the ratio, then sqrt(area * ratio) and its quotient by the ratio, each side
  // rounded (halves to even: nearbyint in the default rounding mode) to a multiple of 32.
  const double ratio = static_cast<double>(width) / static_cast<double>(height);
  const double w = std::sqrt(static_cast<double>(area) * ratio);
  const double h = w / ratio;
  return {static_cast<int64_t>(std::nearbyint(w / 32)) * 32,
          static_cast<int64_t>(std::nearbyint(h / 32)) * 32};
}

Image QwenImagePipeline::edit_resized(const Image& image, int64_t area) {
  const auto [width, height] = edit_image_size(area, image.width, image.height);
  if (image.width == width && image.height == height) return image;  // PIL's resize to its own size: a copy
  return pipelines::resize_lanczos(image, static_cast<int>(width), static_cast<int>(height));
}

std::vector<models::ImageGrid> QwenImagePipeline::image_grids(const std::vector<Image>& images) const {
  return process(images, *processor_).grids;
}

std::vector<int64_t> QwenImagePipeline::tokenize_with_images(
    const std::string& text, const std::vector<models::ImageGrid>& grids) const {
  const std::string expanded =
      models::qwen2_vl_expand_image_tokens(text, grids, text_encoder_->config().spatial_merge_size);
  tokenizers::BpeEncodeOptions options;
  options.truncation = false;  // the processor pads and never cuts
  options.pad_to_max_length = false;
  return tokenizer_->encode(expanded, options).ids;
}

std::pair<Tensor, Tensor> QwenImagePipeline::encode_prompt_with_images(
    const std::vector<std::string>& prompts, const std::vector<Image>& images,
    const std::function<std::string(const std::string&)>& templated, int n,
    int64_t max_sequence_length) const {
  // The images read once (processor and vision tower, all in one call, each at its own grid); their patch
  // embeddings fill every prompt's image tokens, image k its k-th run.
  const ProcessedImages processed = process(images, *processor_);
  const Tensor embeds = vision_->forward(processed.pixel_values.to(dtype_), processed.grids);
  const models::MultimodalInputs inputs =
      models::multimodal_inputs(text_encoder_->config(), embeds, processed.grids,
                                /*multimodal_positions=*/true);
  std::vector<Tensor> features;
  for (const std::string& prompt : prompts)
    features.push_back(prompt_features(tokenize_with_images(templated(prompt), processed.grids),
                                       kEditTemplateTokens, max_sequence_length, &inputs));
  return batched_features(features, n);
}

std::pair<Tensor, std::vector<models::QwenImageShape>> QwenImagePipeline::image_context(
    const std::vector<Image>& images, DType dtype, int64_t batch) const {
  const int64_t multiple = vae_->config().scale_factor() * 2;
  std::vector<Tensor> packed;
  std::vector<models::QwenImageShape> shapes;
  for (const Image& image : images) {
    const Tensor pixels = pipelines::preprocess_image(image, image.height, image.width);
    const Tensor encoded = pipelines::encode_image(*vae_, pixels, dtype, nullptr);
    const Tensor repeated =
        batch > 1 ? concat(std::vector<Tensor>(static_cast<size_t>(batch), encoded), 0) : encoded;
    packed.push_back(models::flux_pack_latents(repeated));
    shapes.push_back({.frames = 1, .height = image.height / multiple, .width = image.width / multiple});
  }
  return {packed.size() == 1 ? packed.front() : concat(packed, 1), shapes};
}

void QwenImagePipeline::check_edit_images(const PipelineRequest& request) const {
  const std::string name = class_name();
  for (size_t k = 0; k < request.image.size(); ++k) {
    const Image& image = request.image[k];
    const double ratio = static_cast<double>(std::max(image.width, image.height)) /
                         static_cast<double>(std::max<int64_t>(1, std::min(image.width, image.height)));
    const std::string which = request.image.size() > 1 ? "image " + std::to_string(k) : "the image";
    pipelines::refuse(image.width < 1 || image.height < 1 || ratio > kMaxAspectRatio, "image",
                      name + ": " + which + " is " + std::to_string(image.width) + "x" +
                          std::to_string(image.height) +
                          "; Qwen2.5-VL reads images whose sides are at most " +
                          std::to_string(static_cast<int>(kMaxAspectRatio)) + " times one another");
  }
}

}  // namespace kiln
