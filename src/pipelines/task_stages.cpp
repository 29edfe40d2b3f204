#include "pipelines/task_stages.h"

#include <vector>

#include "kiln/ops.h"
#include "pipelines/denoise.h"
#include "pipelines/image_processor.h"

namespace kiln::pipelines {

namespace {

Tensor packed(const TaskCall& c, const Tensor& latents) {
  return c.pack ? c.pack(latents) : latents;
}

// `x` [1, ...] repeated `batch` times along the first dimension.
Tensor repeated(const Tensor& x, int64_t batch) {
  return batch > 1 ? concat(std::vector<Tensor>(static_cast<size_t>(batch), x), 0) : x;
}

TaskStart from_noise(const TaskCall& c) {
  TaskStart start;
  const Shape shape = c.codec.latent_shape(c.batch, c.call.height, c.call.width);
  Tensor noise = randn_tensor(shape, c.generators.noise(), c.dtype);
  // diffusers' prepare_latents: latents * init_noise_sigma (1 for flow matching: left as drawn).
  const double sigma = c.schedule.init_noise_sigma();
  if (sigma != 1.0) noise = mul(noise, sigma);
  start.latents = packed(c, noise);
  start.end_step = c.end_step.value_or(-1);
  return start;
}

// Latents given to start from [1 or B, C, h, w], as the call's batch.
Tensor given_latents(const TaskCall& c) {
  const Tensor latents = c.request.image_latents.to(c.dtype);
  return latents.shape()[0] == c.batch ? latents : repeated(latents, c.batch);
}

TaskStart from_image(const TaskCall& c) {
  const PipelineRequest& r = c.request;
  TaskStart start;
  start.start_step =
      c.start_step.value_or(first_step(c.call.num_inference_steps, c.call.strength, c.whole_strength_steps));
  start.end_step = c.end_step.value_or(-1);
  const bool given = r.image_latents.defined();  // latents instead of an image
  const bool add_noise = !c.start_step.has_value();
  // padding_mask_crop: the image and the mask cropped around the mask and fitted to the call's size.
  if (c.task == Task::Inpainting) start.crop = check_mask_crop(c.pipeline, r, c.call.height, c.call.width);
  if (!given) {
    const Image& image = start.crop ? crop_and_fill(r.image.front(), *start.crop, c.call.width, c.call.height)
                                    : r.image.front();
    start.image = preprocess_image(image, c.call.height, c.call.width);
  }
  if (c.task != Task::ImageToImage) {
    const Image& mask =
        start.crop ? crop_and_fill(*r.mask_image, *start.crop, c.call.width, c.call.height) : *r.mask_image;
    start.mask = preprocess_mask(mask, c.call.height, c.call.width);
  }
  // prepare_latents: the image encoded (its posterior sampled: the generator's first draw), then the noise,
  // the image noised to the first step the strength runs. At full strength inpainting may start from the
  // noise itself, and a denoiser that reads the masked image then never needs the image's latents: diffusers
  // does not encode it (no draw).
  const bool inpainting = c.task == Task::Inpainting;
  const bool noise_itself = inpainting && add_noise && c.noise_at_full_strength && c.call.strength == 1.0;
  const bool channels = inpainting && c.masked_image_channels;
  Tensor image_latents;
  if (given)
    image_latents = given_latents(c);
  else if (!(channels && noise_itself))
    image_latents = repeated(encode_image(c.codec, start.image, c.dtype, &c.generators.single()), c.batch);
  const Shape shape = c.codec.latent_shape(c.batch, c.call.height, c.call.width);
  // Without noise added, image-to-image draws none; inpainting still draws the noise its blend uses.
  if (!add_noise && !inpainting) {
    start.latents = packed(c, image_latents);
    return start;
  }
  Tensor noise = randn_tensor(shape, c.generators.noise(), c.dtype);
  if (image_latents.defined()) noise = noise.to(image_latents.device());
  // At full strength that noise is scaled as text-to-image's (init_noise_sigma: 1 for flow matching).
  const double sigma = c.schedule.init_noise_sigma();
  start.latents = packed(c, !add_noise     ? image_latents
                            : noise_itself ? (sigma != 1.0 ? mul(noise, sigma) : noise)
                                           : c.schedule.scale_noise(image_latents, start.start_step, noise));
  if (!inpainting) return start;
  // prepare_mask_latents: the mask at the latents' size (nearest), and the masked image (black where the mask
  // repaints: the image times mask < 0.5, the mask being 0 or 1) encoded, its posterior sampled after the
  // noise.
  const Tensor small = resize_nearest(start.mask, shape[2], shape[3]).to(c.dtype);
  if (channels) {
    const Tensor masked = mul(start.image, sub(1.0, start.mask));
    start.masked_image_latents =
        repeated(encode_image(c.codec, masked, c.dtype, &c.generators.single()), c.batch);
    start.mask_latents = repeated(small, c.batch);
    return start;
  }
  // A denoiser of the latents' own channels never reads the masked image; its posterior sample is drawn all
  // the same, so that the generator ends where diffusers' does. The mask, one value per channel, blends the
  // kept region back after each step.
  // (Latents given have no masked image: diffusers draws nothing for it then.)
  const Shape one = c.codec.latent_shape(1, c.call.height, c.call.width);
  if (!given) (void)randn_tensor(one, c.generators.single(), c.dtype);
  const Tensor mask = packed(c, small.expand(shape).contiguous());
  start.blend = inpaint_blend(c.schedule, packed(c, image_latents), packed(c, noise), mask, start.end_step);
  return start;
}

}  // namespace

NoiseDraw noise_draw(CallGenerators& generators) {
  return [&generators](const Shape& shape, DType dtype) {
    return randn_tensor(shape, generators.noise(), dtype);
  };
}

Tensor encode_image(const models::LatentCodec& codec, const Tensor& image, DType dtype,
                    Generator* generator) {
  const models::LatentDistribution posterior = codec.encode(image.to(dtype));
  return codec.to_latents(generator ? sample_latents(posterior, *generator) : posterior.mean);
}

TaskStart start_latents(const TaskCall& c) {
  switch (c.task) {
    case Task::TextToImage:
    case Task::ImageEditing:
      return from_noise(c);
    case Task::ImageToImage:
    case Task::Inpainting:
    case Task::Fill:
      return from_image(c);
  }
  KILN_FAIL("internal: task " << task_name(c.task));
}

void check_task_inputs(Task task, const char* pipeline, const PipelineRequest& request,
                       const ResolvedRequest& call, bool whole_strength_steps) {
  if (task == Task::Inpainting) check_mask_crop(pipeline, request, call.height, call.width);
  if (task == Task::ImageToImage || task == Task::Inpainting || task == Task::Fill)
    check_strength(pipeline, call.strength, call.num_inference_steps, whole_strength_steps);
}

std::map<std::string, std::string> call_metadata(const TaskCall& c, const std::string& model, DType dtype,
                                                 bool negative) {
  const PipelineRequest& r = c.request;
  auto metadata = common_metadata(model, c.pipeline, c.generators.seed_of(0), c.call.num_inference_steps,
                                  c.call.guidance_scale, c.call.height, c.call.width, dtype);
  if (!r.prompt_embeds.defined()) {
    metadata["prompt"] = r.prompt;
    metadata["max_sequence_length"] = std::to_string(c.call.max_sequence_length);
  }
  if (negative && !r.negative_prompt_embeds.defined())
    metadata["negative_prompt"] = negative_prompt_of(r, 0).value_or("");
  if (r.prompt_2) metadata["prompt_2"] = *r.prompt_2;
  if (r.prompt_3) metadata["prompt_3"] = *r.prompt_3;
  if (negative && r.negative_prompt_2) metadata["negative_prompt_2"] = *r.negative_prompt_2;
  // SDXL's hand-off: the part of the schedule the image comes from.
  if (r.denoising_start) metadata["denoising_start"] = std::to_string(*r.denoising_start);
  if (r.denoising_end) metadata["denoising_end"] = std::to_string(*r.denoising_end);
  return metadata;
}

PipelineOutput task_output(const TaskCall& c, const TaskStart& start, const Tensor& images,
                           std::map<std::string, std::string> metadata, bool negative) {
  // (denoising_start replaces strength, which the call then ignores.)
  const bool edits = c.task == Task::ImageToImage || c.task == Task::Inpainting || c.task == Task::Fill;
  if (edits && !c.request.denoising_start) metadata["strength"] = std::to_string(c.call.strength);
  PipelineOutput output = make_output(c.request, images, std::move(metadata), start.crop);
  label_prompts(output, c.request, negative);
  c.generators.hand_back(output);
  return output;
}

PipelineOutput latent_output(const TaskCall& c, const Tensor& latents) {
  PipelineOutput output{.latents = latents};
  c.generators.hand_back(output);
  return output;
}

}  // namespace kiln::pipelines
