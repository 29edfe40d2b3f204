// The tasks' shared stages (kiln/pipelines/pipeline_registry.h's Task), prepared once for every family: where
// a call's latents start (noise; or the image encoded and noised to the step `strength` runs from), what
// inpainting blends back after each step, the task's checks that need the call's size, and the output (the
// crop pasted back, the task's metadata). A family says how its denoiser lays latents out (`pack`), which VAE
// encodes (its LatentCodec), and adds what is its own on top (FLUX.1 Fill's channels, Kontext's tokens).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "kiln/models/latent_codec.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/schedulers/scheduler.h"
#include "pipelines/call_generators.h"
#include "pipelines/mask_crop.h"
#include "pipelines/pipeline_common.h"

namespace kiln::pipelines {

// One call, as the stages see it.
struct TaskCall {
  Task task = Task::TextToImage;
  const char* pipeline = "";  // the class, in messages
  const PipelineRequest& request;
  const ResolvedRequest& call;  // its size, steps and strength
  int64_t batch = 1;            // the images it makes
  DType dtype = float32;        // the latents'
  CallGenerators& generators;
  const Scheduler& schedule;  // set for the call: the image is noised to its first step
  const models::LatentCodec& codec;
  // The denoiser's layout of latents [B, C, h, w] (FLUX: 2x2 patches as tokens); unset: as they are.
  std::function<Tensor(const Tensor&)> pack;
  // diffusers' SD3 and Stable Diffusion inpainting start from the noise itself (times init_noise_sigma) at
  // strength 1 rather than from the image noised to the first step (the same values where that step's sigma
  // is exactly 1).
  bool noise_at_full_strength = false;
  // Inpainting with a denoiser that reads the mask and the masked image's latents beside the latents
  // (diffusers' 9-channel inpainting UNets): TaskStart carries them, nothing is blended back, and at full
  // strength (with noise_at_full_strength) the image itself is not encoded, as diffusers skips it there.
  bool masked_image_channels = false;
  // diffusers' SD and SDXL pipelines floor the steps a strength runs (int(n * strength)) where the flow-match
  // ones do not (first_step's whole_steps).
  bool whole_strength_steps = false;
  // SDXL's hand-off (diffusers' denoising_start): the first step to run instead of strength's, the image's
  // latents (request.image_latents as they are, or the image encoded) taken without noise added.
  std::optional<int> start_step;
  // diffusers' denoising_end: the step the loop stops before (unset: the schedule's end).
  std::optional<int> end_step;
};

struct TaskStart {
  Tensor latents;  // in the denoiser's layout
  int start_step = 0;
  int end_step = -1;  // the step the loop stops before; -1: the schedule's end
  // Inpainting: after each step, the region outside the mask put back from the image noised to the next step.
  std::function<Tensor(const Tensor&, int)> blend;
  // Inpainting with masked_image_channels instead (not packed, in the latents' dtype): the mask at the
  // latents' size [B, 1, h, w] (nearest) and the masked image's latents [B, C, h, w] (its posterior sampled).
  Tensor mask_latents, masked_image_latents;
  std::optional<CropRegion> crop;  // inpainting's padding_mask_crop
  // The editing tasks' preprocessed (and cropped) image [1, 3, H, W] in [-1, 1] and mask [1, 1, H, W] of 0
  // and 1, for what a family adds of its own (Fill's masked image).
  Tensor image, mask;
};

// Where the call starts, by its task. Text-to-image and image editing: noise (drawn from the request's
// generators). Latents given (request.image_latents) take the encoded image's place (no posterior drawn, nor
// the masked image's); with TaskCall's start_step they are not noised (img2img draws no noise, inpainting
// draws the noise its blend uses, as diffusers' prepare_latents with add_noise false). Image-to-image,
// inpainting and Fill: the image (cropped with padding_mask_crop) encoded, its posterior sampled (the
// generator's first draw), then noise, the image noised to the first step the strength runs; inpainting also
// draws the masked image's posterior sample diffusers draws (so the generator ends where diffusers' does) and
// blends the kept region back after each step, or, with masked_image_channels, hands the denoiser the mask
// and that sample (and skips the image's own encoding at full strength).
TaskStart start_latents(const TaskCall& c);

// The call's noise for a scheduler's step (DenoiseLoop::noise): drawn from its generators, image by image.
NoiseDraw noise_draw(CallGenerators& generators);

// A preprocessed image [1, 3, H, W] encoded as the denoiser's latents [1, C, h, w] (not packed): its
// posterior sampled with `generator`, its mean without one.
Tensor encode_image(const models::LatentCodec& codec, const Tensor& image, DType dtype, Generator* generator);

// The checks of a task's inputs that need the call's size: strength leaves a step (counted as TaskCall's
// whole_strength_steps says); the crop fits.
void check_task_inputs(Task task, const char* pipeline, const PipelineRequest& request,
                       const ResolvedRequest& call, bool whole_strength_steps = false);

// The metadata every image of the call carries: the model, class, seed, steps, guidance, size and dtype; the
// prompt and its tokens (unless embeddings were given), prompt_2 / prompt_3 when set, and the negative prompt
// when one guided the call (`negative`, unless given as embeddings).
std::map<std::string, std::string> call_metadata(const TaskCall& c, const std::string& model, DType dtype,
                                                 bool negative);

// The call's output from its decoded images [B, H, W, 3]: 8-bit images with `metadata` and the task's (its
// strength), or the array; inpainting's crop pasted back into the image. The generators' states handed back,
// and with prompt lists each image labelled with its prompt (and negative prompt when `negative`).
PipelineOutput task_output(const TaskCall& c, const TaskStart& start, const Tensor& images,
                           std::map<std::string, std::string> metadata, bool negative);
// The same for output_type "latent": the latents as the loop ends.
PipelineOutput latent_output(const TaskCall& c, const Tensor& latents);

}  // namespace kiln::pipelines
