// QwenImageEditPipeline: Qwen-Image-Edit (Qwen/Qwen-Image-Edit, -2509), as diffusers' QwenImageEditPipeline:
// one image and an instruction.
//
//   auto pipe = kiln::QwenImageEditPipeline::from_pretrained("Qwen/Qwen-Image-Edit", {.dtype =
//   kiln::bfloat16}); auto result = pipe({.prompt = "turn the cat into a fox", .negative_prompt = " ",
//                       .image = {kiln::Image::load("cat.png")}, .generator = kiln::Generator(0)});
//
// The image is resized (PIL's Lanczos) to its aspect ratio at 1024 x 1024 pixels' area, sides multiples
// of 32. Qwen2.5-VL reads it with the instruction: its vision tower's patch embeddings (the processor's
// resize and patches) take the places of the template's image tokens, at their 3-D positions; the final
// states, less the template's first 64 tokens, are the text features. The VAE encodes the resized image (its
// posterior's mode) and its packed latents sit beside the noise's tokens in every transformer call (their
// prediction dropped). Without height and width, the output has the resized image's size. Everything else is
// QwenImagePipeline's: true CFG with the norm rescale, the schedule, the decode.
//
// Positions: diffusers 0.42.1 calls transformers 5's Qwen2.5-VL without mm_token_type_ids, which gives the
// image's tokens the text's sequential positions; Kiln gives them the 3-D positions the model was trained
// with (as transformers 4 always did).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "kiln/families/qwen_image/qwen_image_pipeline.h"

namespace kiln {

class QwenImageEditPipeline : public QwenImagePipeline {
 public:
  static QwenImageEditPipeline from_pretrained(const std::string& model,
                                               const PipelineLoadOptions& options = {});
  QwenImageEditPipeline(QwenImageEditPipeline&&) noexcept;
  QwenImageEditPipeline& operator=(QwenImageEditPipeline&&) noexcept;
  ~QwenImageEditPipeline() override;
  const char* class_name() const override { return "QwenImageEditPipeline"; }

  // The templated instruction, one "<|image_pad|>" where the image goes.
  static std::string template_prompt(const std::string& prompt);
  // The area the image is resized to, for Qwen2.5-VL and the VAE alike.
  static constexpr int64_t kImageArea = 1024 * 1024;
  // diffusers' calculate_dimensions(1024 * 1024, width / height): (width, height), multiples of 32.
  static std::pair<int64_t, int64_t> image_size(int64_t width, int64_t height);
  // The image as the pipeline resizes it (PIL's Lanczos, to image_size()).
  static Image resized(const Image& image);
  // The instruction's token ids with the image's tokens expanded for `image` (resized as the pipeline does).
  std::vector<int64_t> tokenize(const std::string& prompt, const Image& image) const;
  // encode_prompt with the image: the text features [B * n, S, hidden] and mask (undefined: none padded).
  std::pair<Tensor, Tensor> encode_prompt(const std::vector<std::string>& prompts, const Image& image, int n,
                                          int64_t max_sequence_length) const;

 protected:
  void check_loaded_request(const PipelineRequest& request) const override;
  PipelineOutput run(const PipelineRequest& request, const pipelines::CallControl& control) override;

 private:
  QwenImageEditPipeline();
  // The call's size: the request's, else the resized image's.
  pipelines::ResolvedRequest resolve_call(const PipelineRequest& request) const;
};

}  // namespace kiln
