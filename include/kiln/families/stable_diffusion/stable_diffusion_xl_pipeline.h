// StableDiffusionXLPipeline: SDXL (and its finetunes: Pony, Illustrious, Juggernaut...) text-to-image, as
// diffusers' StableDiffusionXLPipeline, from a diffusers folder or a Hugging Face repo id in the local cache:
//
//   auto pipe = kiln::StableDiffusionXLPipeline::from_pretrained("stabilityai/stable-diffusion-xl-base-1.0");
//   auto result = pipe({.prompt = "a lighthouse at dawn", .generator = kiln::Generator(0)});
//
// Two CLIP towers read the prompt (prompt_2 for the second, OpenCLIP ViT-bigG): their penultimate hidden
// states side by side are the UNet's cross-attention context, the second's projected pooled output and six
// size numbers (original_size, crops_coords_top_left, target_size) its added conditions. Without a negative
// prompt, the negative embeddings are zeros (the folder's force_zeros_for_empty_prompt, true for SDXL base).
// The folder's scheduler (Euler for SDXL base) or the call's `scheduler`; AutoencoderKL decodes latents /
// scaling_factor. Defaults: diffusers' (sample_size * 8 pixels square: 1024, 50 steps, guidance 5).
//
// The refiner's folder (stabilityai/stable-diffusion-xl-refiner-1.0: no text_encoder, its model_index.json's
// requires_aesthetics_score) loads as the image-to-image and inpainting classes: the second tower alone reads
// the prompt, and the time ids hold an aesthetic score (aesthetic_score, negative_aesthetic_score) in place
// of the target size. The text-to-image class refuses it, as diffusers' fails on it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/families/stable_diffusion/unet_pipeline.h"

namespace kiln {

namespace models {
class ClipTextModel;
}  // namespace models
namespace tokenizers {
class ClipTokenizer;
}  // namespace tokenizers

class StableDiffusionXLPipeline : public UNetPipeline {
 public:
  static StableDiffusionXLPipeline from_pretrained(const std::string& model,
                                                   const PipelineLoadOptions& options = {});
  StableDiffusionXLPipeline(StableDiffusionXLPipeline&&) noexcept;
  StableDiffusionXLPipeline& operator=(StableDiffusionXLPipeline&&) noexcept;
  ~StableDiffusionXLPipeline() override;
  // diffusers' from_pipe: a StableDiffusionXLPipeline holding `pipe`'s components, nothing loaded again.
  static StableDiffusionXLPipeline from_pipe(const StableDiffusionXLPipeline& pipe);

  const char* class_name() const override { return "StableDiffusionXLPipeline"; }
  PipelineDefaults family_defaults() const override;

  // ---- the stages, as diffusers names them
  struct PromptEmbeddings {
    Tensor prompt_embeds;         // [B, 77, hidden + hidden_2]
    Tensor pooled_prompt_embeds;  // [B, projection_dim of text_encoder_2]
  };
  // encode_prompt for one side of guidance: hidden_states[-(clip_skip + 2)] of both towers side by side and
  // the second tower's text_embeds, in the pipeline's dtype. The refiner's one tower reads `prompts`.
  PromptEmbeddings encode_prompt(const std::vector<std::string>& prompts,
                                 const std::vector<std::string>& prompts_2, int clip_skip = 0) const;

  // Whether this is the refiner: its UNet is conditioned on an aesthetic score (model_index.json's
  // requires_aesthetics_score).
  bool requires_aesthetics_score() const { return requires_aesthetics_score_; }
  std::vector<std::pair<std::string, nn::Module*>> components() const override;
  ActivationEstimate estimate_activations(const PipelineRequest& request,
                                          const Device& device) const override;

 protected:
  StableDiffusionXLPipeline(const StableDiffusionXLPipeline& pipe, SharingComponents);
  StableDiffusionXLPipeline();
  static void load(StableDiffusionXLPipeline& pipe, const std::string& model,
                   const PipelineLoadOptions& options, const char* pipeline_class);
  void check_loaded_request(const PipelineRequest& request) const override;

 private:
  PipelineOutput run(const PipelineRequest& request, const pipelines::CallControl& control) override;
  // _get_add_time_ids for the call's rows: the positive ids, or under guidance the negative's and the
  // positive's as diffusers orders them for the class's task.
  Tensor add_time_ids(const PipelineRequest& request, bool guided) const;
  // 6 (original size, crop corner, target size), or the refiner's 5 (an aesthetic score for the target size).
  int64_t time_id_count() const;
  // The UNet's context and added-condition widths against the text encoders' and the time ids'.
  void check_conditioning_widths() const;
  // Warns about the request's fields this folder and class do not read (as diffusers ignores them).
  void warn_unread_fields(const PipelineRequest& request) const;

  std::shared_ptr<tokenizers::ClipTokenizer> tokenizer_, tokenizer_2_;  // tokenizer_: null in the refiner
  std::shared_ptr<models::ClipTextModel> text_encoder_,
      text_encoder_2_;  // text_encoder_: null in the refiner
  bool force_zeros_for_empty_prompt_ = true;
  bool requires_aesthetics_score_ = false;
};

// StableDiffusionXLImg2ImgPipeline: image-to-image from an SDXL base or refiner folder. Without height and
// width, the image's own size (rounded down to multiples of 8). Defaults: strength 0.3.
class StableDiffusionXLImg2ImgPipeline : public StableDiffusionXLPipeline {
 public:
  static StableDiffusionXLImg2ImgPipeline from_pretrained(const std::string& model,
                                                          const PipelineLoadOptions& options = {});
  static StableDiffusionXLImg2ImgPipeline from_pipe(const StableDiffusionXLPipeline& pipe);
  const char* class_name() const override { return "StableDiffusionXLImg2ImgPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  StableDiffusionXLImg2ImgPipeline() = default;
  StableDiffusionXLImg2ImgPipeline(const StableDiffusionXLPipeline& pipe, SharingComponents)
      : StableDiffusionXLPipeline(pipe, SharingComponents{}) {}
};

// StableDiffusionXLInpaintPipeline with a 4-channel UNet: the kept region put back from the image noised to
// each next step. Defaults: strength 0.9999 (diffusers').
class StableDiffusionXLInpaintPipeline : public StableDiffusionXLPipeline {
 public:
  static StableDiffusionXLInpaintPipeline from_pretrained(const std::string& model,
                                                          const PipelineLoadOptions& options = {});
  static StableDiffusionXLInpaintPipeline from_pipe(const StableDiffusionXLPipeline& pipe);
  const char* class_name() const override { return "StableDiffusionXLInpaintPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  StableDiffusionXLInpaintPipeline() = default;
  StableDiffusionXLInpaintPipeline(const StableDiffusionXLPipeline& pipe, SharingComponents)
      : StableDiffusionXLPipeline(pipe, SharingComponents{}) {}
};

}  // namespace kiln
