// ChromaPipeline: lodestones' Chroma (Chroma1-HD, Chroma1-Base, Chroma1-Flash) text-to-image, as diffusers'
// ChromaPipeline, from a diffusers folder or a Hugging Face repo id in the local cache:
//
//   auto pipe = kiln::ChromaPipeline::from_pretrained("lodestones/Chroma1-HD", {.dtype = kiln::bfloat16});
//   auto result = pipe({.prompt = "a lighthouse at dawn", .negative_prompt = "blurry, low quality",
//                       .generator = kiln::Generator(0)});
//   result.images[0].save("output.png");
//
// FLUX.1-schnell's transformer with T5 alone (no CLIP), every block's modulation made by a distilled-guidance
// approximator from the timestep, an attention mask over T5's padding (the prompt's tokens and one padding
// token kept), and real classifier-free guidance with a negative prompt when guidance_scale > 1 (two
// transformer calls a step). Defaults: 1024 x 1024, 35 steps, guidance 5, 512 tokens. It takes prompts (not
// prompt_embeds: diffusers pairs those with attention masks, which Kiln's request does not carry).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/pipelines/diffusion_pipeline.h"

namespace kiln {

namespace models {
class T5EncoderModel;
class ChromaTransformer2DModel;
class AutoencoderKL;
}  // namespace models
namespace tokenizers {
class T5Tokenizer;
}  // namespace tokenizers
class FlowMatchEulerDiscreteScheduler;

class ChromaPipeline : public DiffusionPipeline {
 public:
  static ChromaPipeline from_pretrained(const std::string& model, const PipelineLoadOptions& options = {});
  ChromaPipeline(ChromaPipeline&&) noexcept;
  ChromaPipeline& operator=(ChromaPipeline&&) noexcept;
  ~ChromaPipeline() override;
  // diffusers' from_pipe: a ChromaPipeline holding `pipe`'s components, nothing loaded again (the same
  // weights, LoRA adapters and compiled programs); its siblings' from_pipe go the other way. A call to either
  // waits for the other's; a setting changed afterwards on one (offload, tiling) is not seen by the other.
  static ChromaPipeline from_pipe(const ChromaPipeline& pipe);

  const char* class_name() const override { return "ChromaPipeline"; }
  PipelineDefaults family_defaults() const override;

  // ---- the stages, as diffusers names them
  struct PromptEmbeddings {
    Tensor prompt_embeds;   // [B, L, joint_attention_dim] (T5, which attends over the prompt's tokens only)
    Tensor attention_mask;  // [B, L] in the embeddings' dtype: the prompt's tokens and one padding token
    Tensor text_ids;        // [L, 3] zeros
  };
  // Each prompt's rows num_images_per_prompt times, in order (diffusers' prompt list).
  PromptEmbeddings encode_prompt(const std::vector<std::string>& prompts, int num_images_per_prompt,
                                 int64_t max_sequence_length) const;

  const models::ChromaTransformer2DModel& transformer() const { return *transformer_; }
  models::ChromaTransformer2DModel& transformer() { return *transformer_; }
  std::vector<std::pair<std::string, nn::Module*>> components() const override;
  nn::Module& denoiser() override;
  ActivationEstimate estimate_activations(const PipelineRequest& request,
                                          const Device& device) const override;

 protected:
  ChromaPipeline(const ChromaPipeline& pipe, SharingComponents);
  ChromaPipeline();
  static void load(ChromaPipeline& pipe, const std::string& model, const PipelineLoadOptions& options,
                   const char* pipeline_class);
  void check_loaded_request(const PipelineRequest& request) const override;
  // Classifier-free guidance (guidance_scale > 1) evaluates the negative prompt in calls of its own.
  bool negative_evaluations(const PipelineRequest& request) const override;

 private:
  models::LatentCodec& latent_codec() const override;
  PipelineOutput run(const PipelineRequest& request, const pipelines::CallControl& control) override;

  std::shared_ptr<tokenizers::T5Tokenizer> tokenizer_;
  std::shared_ptr<models::T5EncoderModel> text_encoder_;
  std::shared_ptr<models::ChromaTransformer2DModel> transformer_;
  std::shared_ptr<models::AutoencoderKL> vae_;
  std::shared_ptr<FlowMatchEulerDiscreteScheduler> scheduler_;
};

// ChromaImg2ImgPipeline: Chroma image-to-image. `image` (one) is resized to the call's size (1024 x 1024
// unless given, not the image's own), encoded by the VAE (its posterior sampled: the generator's first draw),
// noised to the schedule's step int(n - n * strength) and denoised from there. Loads ChromaPipeline folders
// too. Defaults: those of ChromaPipeline, strength 0.9.
class ChromaImg2ImgPipeline : public ChromaPipeline {
 public:
  static ChromaImg2ImgPipeline from_pretrained(const std::string& model,
                                               const PipelineLoadOptions& options = {});
  // diffusers' from_pipe: the ChromaPipeline's components (its siblings' too), nothing loaded again.
  static ChromaImg2ImgPipeline from_pipe(const ChromaPipeline& pipe);
  const char* class_name() const override { return "ChromaImg2ImgPipeline"; }
  PipelineDefaults family_defaults() const override;

 private:
  ChromaImg2ImgPipeline() = default;
  ChromaImg2ImgPipeline(const ChromaPipeline& pipe, SharingComponents)
      : ChromaPipeline(pipe, SharingComponents{}) {}
};

}  // namespace kiln
