// QwenImageEditPlusPipeline: Qwen-Image-Edit-2509 (Qwen/Qwen-Image-Edit-2509), as diffusers'
// QwenImageEditPlusPipeline: an instruction about one or several images.
//
//   auto pipe = kiln::QwenImageEditPlusPipeline::from_pretrained("Qwen/Qwen-Image-Edit-2509",
//                                                                {.dtype = kiln::bfloat16});
//   auto result = pipe({.prompt = "the cat of picture 1 on the sofa of picture 2", .negative_prompt = " ",
//                       .image = {kiln::Image::load("cat.png"), kiln::Image::load("sofa.png")},
//                       .generator = kiln::Generator(0)});
//
// Each image is resized twice from the original (PIL's Lanczos, its aspect ratio, sides multiples of 32): to
// 384 x 384 pixels' area for Qwen2.5-VL and to 1024 x 1024 for the VAE. The instruction follows one
// "Picture N: <|vision_start|><|image_pad|><|vision_end|>" per image in the template; the vision tower's
// patch embeddings of every image take the places of their image tokens, at their 3-D positions; the final
// states, less the template's first 64 tokens, are the text features. The VAE encodes each image (its
// posterior's mode, normalised); their packed latents follow the noise's tokens, image after image, in every
// transformer call (their prediction dropped), each at its own grid. Without height and width, the output
// has the LAST image's ratio at 1024 x 1024 area. One prompt a call (diffusers refuses more); any number of
// images (diffusers sets no limit; the model was trained with one to three). Everything else is
// QwenImagePipeline's: true CFG with the norm rescale (true_cfg_scale 4 by default), the schedule, the
// decode.
//
// Positions: as QwenImageEditPipeline, Kiln gives the image tokens Qwen2.5-VL's own 3-D positions, which
// diffusers 0.42.1 (under transformers 5) does not pass.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/families/qwen_image/qwen_image_pipeline.h"

namespace kiln {

class QwenImageEditPlusPipeline : public QwenImagePipeline {
 public:
  static QwenImageEditPlusPipeline from_pretrained(const std::string& model,
                                                   const PipelineLoadOptions& options = {});
  QwenImageEditPlusPipeline(QwenImageEditPlusPipeline&&) noexcept;
  QwenImageEditPlusPipeline& operator=(QwenImageEditPlusPipeline&&) noexcept;
  ~QwenImageEditPlusPipeline() override;
  const char* class_name() const override { return "QwenImageEditPlusPipeline"; }

  // The areas each image is resized to: for Qwen2.5-VL (CONDITION_IMAGE_SIZE) and the VAE (VAE_IMAGE_SIZE).
  static constexpr int64_t kConditionArea = 384 * 384;
  static constexpr int64_t kVaeArea = 1024 * 1024;
  // The templated instruction about `images` pictures: "Picture N: " and the image's tokens for each.
  static std::string template_prompt(const std::string& prompt, size_t images);
  // diffusers' calculate_dimensions(area, width / height): (width, height), multiples of 32.
  static std::pair<int64_t, int64_t> image_size(int64_t area, int64_t width, int64_t height);
  // The image as the pipeline resizes it to `area` (PIL's Lanczos, to image_size()).
  static Image resized(const Image& image, int64_t area);
  // The instruction's token ids with each image's tokens expanded (`images` resized for Qwen2.5-VL).
  std::vector<int64_t> tokenize(const std::string& prompt, const std::vector<Image>& images) const;
  // encode_prompt with the images (resized for Qwen2.5-VL): the text features [B * n, S, hidden] and mask
  // (undefined: none padded).
  std::pair<Tensor, Tensor> encode_prompt(const std::vector<std::string>& prompts,
                                          const std::vector<Image>& images, int n,
                                          int64_t max_sequence_length) const;

 protected:
  void check_loaded_request(const PipelineRequest& request) const override;
  PipelineOutput run(const PipelineRequest& request, const pipelines::CallControl& control) override;

 private:
  QwenImageEditPlusPipeline();
  // The call's size: the request's, else the last image's ratio at kVaeArea.
  pipelines::ResolvedRequest resolve_call(const PipelineRequest& request) const;
};

}  // namespace kiln
