// What a caller asks a pipeline for: one request type for every pipeline, with diffusers' argument names
// (the keyword arguments of a pipeline's __call__). A pipeline refuses, by name, a field it does not take
// (RequestError: FluxFillPipeline has no negative prompt, only FLUX.2 takes reference images); fields left
// unset take that pipeline's diffusers defaults (DiffusionPipeline::defaults()).
//
//   kiln::PipelineRequest request{.prompt = "a cat", .height = 512, .width = 512, .num_inference_steps = 4,
//                                 .guidance_scale = 0.0f, .generator = kiln::Generator(0)};
//   request.callback_on_step_end = [](kiln::StepState& s) { std::printf("step %d of %d\n", s.step + 1,
//   s.num_steps); }; auto result = pipe(request);
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/pipelines/generator.h"
#include "kiln/pipelines/image.h"

namespace kiln {

// A request that names a field the pipeline does not take, or a value out of its range: field() is the
// request's field ("negative_prompt"), so a command line can name its flag and a server its JSON field.
class RequestError : public Error {
 public:
  RequestError(std::string field, const std::string& message) : Error(message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// Thrown by a pipeline call that was cancelled (CancellationToken::cancel): no image; the call's memory is
// freed and the pipeline serves the next call as if this one had not run.
class Cancelled : public Error {
 public:
  using Error::Error;
};

// Shared between a call and whoever may cancel it (another thread, a signal handler's flag, a server whose
// client went away): copies refer to the same flag. A cancelled call stops at its next step boundary.
class CancellationToken {
 public:
  CancellationToken() : flag_(std::make_shared<std::atomic<bool>>(false)) {}
  void cancel() const { flag_->store(true, std::memory_order_relaxed); }
  bool cancelled() const { return flag_->load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<std::atomic<bool>> flag_;
};

// What callback_on_step_end sees after each denoising step (diffusers' callback_on_step_end with its
// callback_kwargs): it may replace `latents` (the loop continues from them) or set `stop` (the remaining
// steps are skipped and what was denoised so far is decoded, as diffusers' pipe._interrupt does).
struct StepState {
  int step = 0;        // from 0
  int num_steps = 0;   // steps this call runs
  float timestep = 0;  // the scheduler's timestep of this step
  double seconds = 0;  // what the step took, its kernels included
  Tensor latents;      // after the step
  bool stop = false;
};

// SD3's skip-layer guidance (off when `layers` is empty; diffusers recommends {7, 8, 9} for 3.5 Medium).
// Active at steps i with start < i / steps < stop.
struct SkipLayerGuidance {
  std::vector<int64_t> layers;
  double scale = 2.8;
  double start = 0.01;
  double stop = 0.2;
};

// What a call returns (diffusers' output_type): 8-bit images ("pil"), the decoded float array ("np"), or
// the latents the denoising loop ends with ("latent", the VAE is not run).
enum class OutputType { Image, Array, Latent };

struct PipelineRequest {
  // Prompt embeddings instead of a prompt (encode_prompt's outputs, e.g. cached or weighted): FLUX.2
  // [B, L, joint_attention_dim]; FLUX.1 T5's [B, L, joint_attention_dim] with CLIP's pooled_prompt_embeds
  // [B, pooled_projection_dim]; SD3 [B, 77 + L, joint_attention_dim] with pooled_prompt_embeds [B, 2048].
  // Each of the B rows makes num_images_per_prompt images.
  Tensor prompt_embeds, pooled_prompt_embeds;
  std::string prompt;
  // The second and third text encoders' prompts (FLUX.1: prompt_2 is T5's; SD3: prompt_2 CLIP-G's, prompt_3
  // T5's); `prompt` when absent or empty, as diffusers.
  std::optional<std::string> prompt_2, prompt_3;
  // diffusers' `prompt` as a list, in the text-to-image pipelines: one call makes num_images_per_prompt
  // images of each prompt, in order, their noise drawn as one batch (the images diffusers makes for the same
  // list). `prompt` is then empty, and prompt_2 / prompt_3 unset (every text encoder reads these prompts).
  std::vector<std::string> prompts;
  // The negative embeddings of classifier-free guidance (FLUX.2 [klein], SD3 with its pooled ones; FLUX.1's
  // true CFG with negative_pooled_prompt_embeds), instead of a negative prompt.
  Tensor negative_prompt_embeds, negative_pooled_prompt_embeds;
  // Classifier-free guidance's negative prompt (SD3, FLUX.2 [klein]: "" when absent; FLUX.1: true CFG runs
  // only with one, see true_cfg_scale).
  std::optional<std::string> negative_prompt;
  // The second and third text encoders' negative prompts (SD3: both; FLUX.1: negative_prompt_2, T5's);
  // negative_prompt when absent or empty.
  std::optional<std::string> negative_prompt_2, negative_prompt_3;
  // With `prompts`: one negative prompt per prompt (diffusers' negative_prompt as a list); or negative_prompt
  // for them all.
  std::vector<std::string> negative_prompts;
  // diffusers' `image=` (RGB; gray and RGBA are converted as PIL's convert("RGB") does): FLUX.2's reference
  // images, conditioning the generation; the image that image-to-image, inpainting and Fill start from (one).
  // The text-to-image pipelines refuse it.
  std::vector<Image> image;
  // SDXL image-to-image and inpainting: latents [1 or B, C, h, w] to start from instead of an image
  // (diffusers' `image=` given a tensor of the VAE's latent channels, e.g. the base's output_type "latent"
  // output, as it leaves its loop: not divided by the VAE's scaling factor). They are taken as they are, not
  // encoded; the call's size is theirs (h and w times the VAE's scale). `image` is then empty.
  Tensor image_latents;
  // Inpainting's and Fill's mask: white repaints, black keeps (gray, binarised at half).
  std::optional<Image> mask_image;
  // Inpainting: repaint only the region around the mask, this many pixels wider on each side and grown to the
  // call's aspect ratio, at the call's size, then paste it back into the image (whose size the output has);
  // diffusers' padding_mask_crop. The mask must have the image's size; images only (not arrays or latents).
  std::optional<int64_t> padding_mask_crop;
  // Image-to-image and inpainting: how much of the schedule runs, in [0, 1] (1: from pure noise).
  std::optional<double> strength;
  // SDXL's hand-off between "expert denoisers" (diffusers' denoising_end / denoising_start), fractions in
  // (0, 1) of the training schedule: a call with denoising_end stops before the first timestep below
  // int(round(T - denoising_end * T)) (T: the scheduler's num_train_timesteps), one with denoising_start runs
  // only the timesteps below int(round(T - denoising_start * T)), strength ignored, from its image_latents
  // (or its image's) without adding noise. The base runs with denoising_end and output_type Latent, the
  // refiner with the same fraction as denoising_start and those latents as image_latents.
  std::optional<double> denoising_end, denoising_start;
  // FLUX.1 Kontext: the image's area in pixels (the size keeps the aspect ratio of height x width; default
  // 1024 x 1024), and whether the input image is resized to the trained resolution nearest its aspect ratio
  // (diffusers' _auto_resize, default true).
  std::optional<int64_t> max_area;
  std::optional<bool> auto_resize;
  std::optional<int64_t> height, width;  // pixels; unset: the pipeline's default
  std::optional<int> num_inference_steps;
  // FLUX.1-dev, FLUX.2-dev: the embedded guidance; SD3, klein: classifier-free guidance (on when > 1).
  std::optional<float> guidance_scale;
  // FLUX.1 (FluxPipeline and its image-to-image, inpainting and Kontext siblings): diffusers' true
  // classifier-free guidance, on when > 1 and a negative_prompt is given (default 1: off). Each step then
  // runs the transformer twice, on the prompt and on the negative prompt, and takes neg + scale * (pos -
  // neg), beside the embedded guidance_scale of FLUX.1-dev.
  std::optional<float> true_cfg_scale;
  // Z-Image's classifier-free guidance: cfg_normalization caps each image's guided prediction at this many
  // times the norm of its positive prediction (0: off, the default; diffusers' True is 1); cfg_truncation
  // turns the guidance off for the steps whose normalised time (1000 - t) / 1000 exceeds it (default 1:
  // never).
  std::optional<float> cfg_normalization, cfg_truncation;
  // The call's step cache (kiln/nn/step_cache.h): "fbcache:0.12" (diffusers' First Block Cache), or "none";
  // unset: the one the transformer's enable_cache set, if any.
  std::optional<std::string> cache;
  // The UNet family (Stable Diffusion 1.x/2.x, SDXL): the sampler this call uses instead of the folder's
  // scheduler ("euler", "euler_a", "dpmpp_2m", "ddim", "pndm" or a diffusers class name, built from the
  // folder's scheduler config as diffusers' from_config swaps them), and use_karras_sigmas for it.
  std::optional<std::string> scheduler;
  std::optional<bool> use_karras_sigmas;
  // diffusers' clip_skip: the prompt's embeddings from this many CLIP layers before the last.
  std::optional<int> clip_skip;
  // diffusers' guidance_rescale (Lin et al.'s fix for overexposure): the guided prediction's standard
  // deviation pulled towards the prompt's by this fraction (0: off).
  std::optional<float> guidance_rescale;
  // SDXL's micro-conditioning, (height, width) pairs and a (top, left) corner: the size the image is said to
  // come from, the size it is said to be, the crop corner (defaults: the call's size, the same, (0, 0)).
  std::vector<int64_t> original_size, target_size, crops_coords_top_left;
  // The same for classifier-free guidance's negative side (defaults: the positive side's).
  std::vector<int64_t> negative_original_size, negative_target_size, negative_crops_coords_top_left;
  // The SDXL refiner's added condition (its folder's requires_aesthetics_score): the aesthetic score the
  // image is said to have, and the negative side's (diffusers' defaults 6 and 2.5). Image-to-image and
  // inpainting.
  std::optional<float> aesthetic_score, negative_aesthetic_score;
  std::optional<Generator> generator;  // torch's default seed when absent
  // diffusers' generator list, in the text-to-image pipelines: image i's noise drawn from generators[i] (so
  // each image is the one its generator makes alone); one per image (prompts x num_images_per_prompt), or
  // one.
  std::vector<Generator> generators;
  std::optional<int64_t> max_sequence_length;  // tokens of the T5 / FLUX.2 text encoder
  int num_images_per_prompt = 1;               // for each prompt; a call makes at most 64 images in all
  SkipLayerGuidance skip_layer_guidance;       // SD3 only
  OutputType output_type = OutputType::Image;
  // Called after each denoising step (see StepState).
  std::function<void(StepState&)> callback_on_step_end;
  // Cancels the call from elsewhere (see CancellationToken). Copies of a request share it: give a copy a new
  // CancellationToken() to cancel it alone.
  CancellationToken cancel;
};

// A pipeline's diffusers defaults for the fields a request leaves unset.
struct PipelineDefaults {
  int64_t height = 1024, width = 1024;
  int num_inference_steps = 28;
  float guidance_scale = 3.5f;
  int64_t max_sequence_length = 512;
  double strength = 1.0;
};

// A model folder's recommended call (recommended_call.json beside model_index.json, diffusers' argument
// names): the values its callers start from instead of the family's, for the fields it names.
struct RecommendedCall {
  std::string path;  // the file
  std::optional<int64_t> height, width;
  std::optional<int> num_inference_steps;
  std::optional<float> guidance_scale;
  std::optional<int64_t> max_sequence_length;
  std::optional<double> strength;

  // `defaults` with this call's values over them.
  PipelineDefaults over(PipelineDefaults defaults) const;
  // "64x64, 4 steps, guidance 0, 40 tokens": the values it sets.
  std::string describe() const;
  // Reads `folder`/recommended_call.json when present (nullopt otherwise). Throws kiln::Error naming the file
  // and the key when it is not a JSON object of these keys with values in their ranges.
  static std::optional<RecommendedCall> read(const std::string& folder);
};

}  // namespace kiln
