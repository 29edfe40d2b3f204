// QwenImagePipeline: Qwen-Image text-to-image, as diffusers' QwenImagePipeline (and its image-to-image and
// inpainting siblings below), from a diffusers folder or a
// Hugging Face repo id in the local cache:
//
//   auto pipe = kiln::QwenImagePipeline::from_pretrained("Qwen/Qwen-Image", {.dtype = kiln::bfloat16});
//   auto result = pipe({.prompt = "a coffee shop sign that reads \"Kiln\"", .negative_prompt = " ",
//                       .true_cfg_scale = 4.0f, .generator = kiln::Generator(0)});
//   result.images[0].save("output.png");
//
// Each prompt goes through the pipeline's template (a system message asking to describe the image) and
// Qwen2.5-VL's language model; its final hidden states at the prompt's tokens, less the template's first 34,
// are its text features (cut at max_sequence_length, the prompts of a call zero-padded to the longest with a
// mask). The dual-stream MMDiT (kiln/families/qwen_image/qwen_image_transformer.h) denoises the VAE's 16
// channels packed as 2 x 2 patches, on the schedule sigmas = linspace(1, 1/n, n) shifted by the image's
// token count; the causal 3-D VAE (kiln/families/qwen_image/autoencoder_kl_qwen_image.h) decodes its single
// frame. True classifier-free guidance with a negative prompt and true_cfg_scale > 1:
// neg + s * (cond - neg), rescaled token by token to the norm of cond. Defaults: diffusers' (1024 x 1024, 50
// steps, true_cfg_scale 4, 512 tokens).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/families/qwen_image/qwen_image_transformer.h"
#include "kiln/pipelines/diffusion_pipeline.h"

namespace kiln {

namespace models {
class DecoderTextEncoder;
class AutoencoderKLQwenImage;
struct MultimodalInputs;
class Qwen2_5_VLVisionModel;
struct Qwen2VLImageProcessorConfig;
struct ImageGrid;
}  // namespace models
namespace pipelines {
struct ResolvedRequest;
}  // namespace pipelines
namespace tokenizers {
class BpeTokenizer;
}  // namespace tokenizers
class FlowMatchEulerDiscreteScheduler;

class QwenImagePipeline : public DiffusionPipeline {
 public:
  static QwenImagePipeline from_pretrained(const std::string& model, const PipelineLoadOptions& options = {});
  QwenImagePipeline(QwenImagePipeline&&) noexcept;
  QwenImagePipeline& operator=(QwenImagePipeline&&) noexcept;
  ~QwenImagePipeline() override;
  // diffusers' from_pipe: a QwenImagePipeline holding `pipe`'s components, nothing loaded again.
  static QwenImagePipeline from_pipe(const QwenImagePipeline& pipe);

  const char* class_name() const override { return "QwenImagePipeline"; }
  PipelineDefaults family_defaults() const override;

  // ---- the stages, as diffusers names them
  // The templated prompt the tokenizer reads (prompt_template_encode).
  static std::string template_prompt(const std::string& prompt);
  // The template's tokens dropped from the text encoder's states (prompt_template_encode_start_idx).
  static constexpr int64_t kTemplateTokens = 34;
  // The longest max_sequence_length diffusers takes.
  static constexpr int64_t kMaxSequenceLength = 1024;
  // The editing classes' template tokens dropped from the text encoder's states (their
  // prompt_template_encode_start_idx).
  static constexpr int64_t kEditTemplateTokens = 64;
  // The templated prompt's token ids, alone (no padding), cut at kMaxSequenceLength + kTemplateTokens.
  std::vector<int64_t> tokenize(const std::string& prompt) const;
  // encode_prompt: the prompts' text features [B * n, S, hidden] in the text encoder's dtype (each prompt's
  // row n times) and their mask [B * n, S] int64, undefined when no token is padding.
  std::pair<Tensor, Tensor> encode_prompt(const std::vector<std::string>& prompts, int n,
                                          int64_t max_sequence_length) const;

  const models::QwenImageTransformer2DModel& transformer() const { return *transformer_; }
  models::QwenImageTransformer2DModel& transformer() { return *transformer_; }
  std::vector<std::pair<std::string, nn::Module*>> components() const override;
  nn::Module& denoiser() override;
  ActivationEstimate estimate_activations(const PipelineRequest& request,
                                          const Device& device) const override;

 protected:
  QwenImagePipeline(const QwenImagePipeline& pipe, SharingComponents);
  QwenImagePipeline();
  static void load(QwenImagePipeline& pipe, const std::string& model, const PipelineLoadOptions& options,
                   const char* pipeline_class);
  void check_loaded_request(const PipelineRequest& request) const override;
  bool negative_evaluations(const PipelineRequest& request) const override;
  PipelineOutput run(const PipelineRequest& request, const pipelines::CallControl& control) override;

  // One prompt's text features: the text encoder's final states at `ids` (with `images` in the places of its
  // image tokens), less the template's first `drop` tokens, cut at max_sequence_length.
  Tensor prompt_features(const std::vector<int64_t>& ids, int64_t drop, int64_t max_sequence_length,
                         const models::MultimodalInputs* images = nullptr) const;
  // Per-prompt features zero-padded to the longest, each n times, and their mask (undefined: none padded).
  static std::pair<Tensor, Tensor> batched_features(const std::vector<Tensor>& features, int n);

  // What a call's transformer reads of its text: the prompts' features and mask and, under true CFG, the
  // negative prompts'.
  struct CallText {
    Tensor embeds, mask, negative_embeds, negative_mask;
    bool true_cfg = false;  // diffusers' do_true_cfg
    float true_cfg_scale = 4.0f;
  };
  // The request's prompts (and negative prompts, one per prompt, under true CFG) through `encode`.
  CallText encode_call(
      const PipelineRequest& request,
      const std::function<std::pair<Tensor, Tensor>(const std::vector<std::string>&)>& encode) const;
  // Prepare, denoise and decode, the stages every class shares: the task's start at call.height x call.width
  // and, for the editing classes, the images' packed latents `context` (each image's tokens in turn) beside
  // the noise's tokens, `context_shapes` their grids in that order, their prediction dropped.
  PipelineOutput denoise(const PipelineRequest& request, const pipelines::ResolvedRequest& call,
                         const CallText& text, const Tensor& context,
                         const std::vector<models::QwenImageShape>& context_shapes,
                         const pipelines::CallControl& control);

  // The refusals every class shares that need the call's size: the size, the task's inputs, the text length.
  void check_call(const PipelineRequest& request, const pipelines::ResolvedRequest& call) const;

  // ---- the editing classes' stages (qwen_image_edit_stages.cpp)
  // diffusers' calculate_dimensions: (width, height) of an image of that ratio at `area` pixels, each side a
  // multiple of 32; and the image resized to it with PIL's Lanczos.
  static std::pair<int64_t, int64_t> edit_image_size(int64_t area, int64_t width, int64_t height);
  static Image edit_resized(const Image& image, int64_t area);
  // `text` (its image tokens one per image) with each image's tokens expanded for its grid, as the processor
  // tokenises it (no truncation, no padding).
  std::vector<int64_t> tokenize_with_images(const std::string& text,
                                            const std::vector<models::ImageGrid>& grids) const;
  // The grids the processor cuts `images` into.
  std::vector<models::ImageGrid> image_grids(const std::vector<Image>& images) const;
  // encode_prompt with images: each prompt as `templated` writes it; the images read once by the processor
  // and the vision tower, their embeddings in every prompt's image tokens at their 3-D positions.
  std::pair<Tensor, Tensor> encode_prompt_with_images(
      const std::vector<std::string>& prompts, const std::vector<Image>& images,
      const std::function<std::string(const std::string&)>& templated, int n,
      int64_t max_sequence_length) const;
  // The images' latents (the posterior's mode, normalised), packed and concatenated image after image, each
  // repeated for the call's `batch` images; and each one's grid.
  std::pair<Tensor, std::vector<models::QwenImageShape>> image_context(const std::vector<Image>& images,
                                                                       DType dtype, int64_t batch) const;
  // Refuses an image whose sides differ more than Qwen2.5-VL's processor takes.
  void check_edit_images(const PipelineRequest& request) const;

  std::shared_ptr<tokenizers::BpeTokenizer> tokenizer_;
  std::shared_ptr<models::DecoderTextEncoder> text_encoder_;
  std::shared_ptr<models::QwenImageTransformer2DModel> transformer_;
  std::shared_ptr<models::AutoencoderKLQwenImage> vae_;
  std::shared_ptr<FlowMatchEulerDiscreteScheduler> scheduler_;
  // The editing class's: Qwen2.5-VL's vision tower and its processor's settings (null for the others).
  std::shared_ptr<models::Qwen2_5_VLVisionModel> vision_;
  std::shared_ptr<models::Qwen2VLImageProcessorConfig> processor_;

 private:
  models::LatentCodec& latent_codec() const override;
};

// QwenImageImg2ImgPipeline: Qwen-Image image-to-image. `image` (one) is resized to height x width (1024 x
// 1024 unless given, as diffusers), encoded by the VAE (its posterior sampled: the generator's first draw),
// normalised by the VAE's per-channel statistics, noised to the schedule's step int(n - n * strength) and
// denoised from there. Loads QwenImagePipeline folders too. Defaults: QwenImagePipeline's, strength 0.6.
class QwenImageImg2ImgPipeline : public QwenImagePipeline {
 public:
  static QwenImageImg2ImgPipeline from_pretrained(const std::string& model,
                                                  const PipelineLoadOptions& options = {});
  static QwenImageImg2ImgPipeline from_pipe(const QwenImagePipeline& pipe);
  const char* class_name() const override { return "QwenImageImg2ImgPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  QwenImageImg2ImgPipeline() = default;
  QwenImageImg2ImgPipeline(const QwenImagePipeline& pipe, SharingComponents)
      : QwenImagePipeline(pipe, SharingComponents{}) {}
};

// QwenImageInpaintPipeline: Qwen-Image inpainting: `image` and `mask_image` (white repaints, black keeps;
// binarised), the kept region put back from the image noised to each next step. Defaults: strength 0.6.
class QwenImageInpaintPipeline : public QwenImagePipeline {
 public:
  static QwenImageInpaintPipeline from_pretrained(const std::string& model,
                                                  const PipelineLoadOptions& options = {});
  static QwenImageInpaintPipeline from_pipe(const QwenImagePipeline& pipe);
  const char* class_name() const override { return "QwenImageInpaintPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  QwenImageInpaintPipeline() = default;
  QwenImageInpaintPipeline(const QwenImagePipeline& pipe, SharingComponents)
      : QwenImagePipeline(pipe, SharingComponents{}) {}
};

}  // namespace kiln
