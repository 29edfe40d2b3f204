#include "pipelines/pipeline_common.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "kiln/core/device_runtime.h"
#include "kiln/core/limits.h"
#include "kiln/io/model_ref.h"
#include "kiln/ops.h"
#include "kiln/runtime/execution_context.h"
#include "pipelines/image_processor.h"

namespace kiln::pipelines {

namespace fs = std::filesystem;

PipelineFolder::PipelineFolder(const std::string& model, const PipelineLoadOptions& options,
                               const char* pipeline_class, std::initializer_list<const char*> compatible)
    : on_loaded_(options.on_component_loaded) {
  KILN_CHECK(options.dtype == float32 || options.dtype == bfloat16 || options.dtype == float16,
             pipeline_class << ": dtype " << dtype_name(options.dtype)
                            << " is not supported (expected f32, bf16 or f16)");
  io::ResolveOptions resolve;
  resolve.revision = options.revision;
  path_ = io::resolve_model(model, resolve).path;
  index_ = io::load_model_index(path_);
  bool known = index_.class_name == pipeline_class;
  for (const char* c : compatible) known = known || index_.class_name == c;
  KILN_CHECK(known, index_.path << ": pipeline class is '" << index_.class_name << "', but this is "
                                << pipeline_class);
}

bool PipelineFolder::present(const char* name) const {
  const io::PipelineComponent* c = index_.find(name);
  return c != nullptr && c->present();
}

std::string PipelineFolder::need(const char* name, std::initializer_list<const char*> classes) const {
  const io::PipelineComponent* c = index_.find(name);
  KILN_CHECK(c != nullptr && c->present(), index_.path << ": component '" << name << "' is missing");
  bool known = false;
  for (const char* cls : classes) known = known || c->class_name == cls;
  KILN_CHECK(known, index_.path << ": component '" << name << "' is a " << c->class_name << ", expected "
                                << *classes.begin());
  const std::string dir = (fs::path(path_) / name).string();
  KILN_CHECK(fs::is_directory(dir), index_.path << ": component folder '" << dir << "' does not exist");
  return dir;
}

void PipelineFolder::loaded(const char* name) {
  if (on_loaded_) on_loaded_(name, ++done_, count_);
}

ResolvedRequest resolve(const PipelineRequest& request, const PipelineDefaults& defaults) {
  return {.height = request.height.value_or(defaults.height),
          .width = request.width.value_or(defaults.width),
          .num_inference_steps = request.num_inference_steps.value_or(defaults.num_inference_steps),
          .guidance_scale = request.guidance_scale.value_or(defaults.guidance_scale),
          .max_sequence_length = request.max_sequence_length.value_or(defaults.max_sequence_length),
          .strength = request.strength.value_or(defaults.strength)};
}

ResolvedRequest resolve_with_image_size(const PipelineRequest& request, const PipelineDefaults& defaults,
                                        bool edits, int64_t multiple) {
  ResolvedRequest r = resolve(request, defaults);
  // Latents to start from (SDXL's hand-off) give the size, as diffusers' image-to-image reads it off them.
  if (edits && request.image_latents.defined() && request.image_latents.dim() == 4) {
    if (!request.height) r.height = request.image_latents.shape()[2] * multiple;
    if (!request.width) r.width = request.image_latents.shape()[3] * multiple;
  } else if (edits && !request.image.empty()) {
    const Image& image = request.image.front();
    if (!request.height) r.height = std::max<int64_t>(image.height / multiple * multiple, multiple);
    if (!request.width) r.width = std::max<int64_t>(image.width / multiple * multiple, multiple);
  }
  return r;
}

void refuse(bool given, const char* field, const std::string& message) {
  if (given) throw RequestError(field, message);
}

Tensor repeat_per_prompt(const Tensor& x, int n) {
  if (n == 1) return x;
  Shape expanded = x.shape(), merged = x.shape();
  expanded.insert(expanded.begin() + 1, n);
  merged[0] *= n;
  return x.unsqueeze(1).expand(expanded).reshape(merged);
}

namespace {

void check_embedding_pair(const char* pipeline, const char* field, const Tensor& embeds, int64_t width,
                          int64_t max_tokens, const char* pooled_field, const Tensor& pooled,
                          int64_t pooled_width) {
  const std::string name = pipeline;
  const auto fail = [&](const char* f, const std::string& expected, const Tensor& got) {
    throw RequestError(f, name + ": " + f + " must be " + expected + ", got " + got.str());
  };
  const bool floating = embeds.dtype() == float32 || embeds.dtype() == bfloat16 || embeds.dtype() == float16;
  if (embeds.dim() != 3 || embeds.size(0) < 1 || embeds.size(1) < 1 || embeds.size(1) > max_tokens ||
      embeds.size(2) != width || !floating)
    fail(field,
         "floating point [B, L, " + std::to_string(width) + "] with 1 <= L <= " + std::to_string(max_tokens),
         embeds);
  if (pooled_width == 0) return;
  refuse(!pooled.defined(), pooled_field,
         name + ": " + field + " needs " + pooled_field + " (the CLIP pooled output), as in diffusers");
  const bool pooled_floating =
      pooled.dtype() == float32 || pooled.dtype() == bfloat16 || pooled.dtype() == float16;
  if (pooled.dim() != 2 || pooled.size(0) != embeds.size(0) || pooled.size(1) != pooled_width ||
      !pooled_floating)
    fail(pooled_field,
         "floating point [" + std::to_string(embeds.size(0)) + ", " + std::to_string(pooled_width) +
             "] (one row per " + field + " row)",
         pooled);
}

}  // namespace

void check_given_embeddings(const char* pipeline, const PipelineRequest& request, int64_t width,
                            int64_t max_tokens, int64_t pooled_width) {
  if (request.prompt_embeds.defined())
    check_embedding_pair(pipeline, "prompt_embeds", request.prompt_embeds, width, max_tokens,
                         "pooled_prompt_embeds", request.pooled_prompt_embeds, pooled_width);
  if (!request.negative_prompt_embeds.defined()) return;
  check_embedding_pair(pipeline, "negative_prompt_embeds", request.negative_prompt_embeds, width, max_tokens,
                       "negative_pooled_prompt_embeds", request.negative_pooled_prompt_embeds, pooled_width);
  const int64_t prompts = batch_size(request) / request.num_images_per_prompt;
  refuse(request.negative_prompt_embeds.size(0) != prompts, "negative_prompt_embeds",
         std::string(pipeline) + ": negative_prompt_embeds has " +
             std::to_string(request.negative_prompt_embeds.size(0)) + " rows for " + std::to_string(prompts) +
             " prompts");
}

std::vector<std::string> prompt_list(const PipelineRequest& request) {
  return request.prompts.empty() ? std::vector<std::string>{request.prompt} : request.prompts;
}

std::optional<std::string> negative_prompt_of(const PipelineRequest& request, size_t i) {
  if (i < request.negative_prompts.size()) return request.negative_prompts[i];
  return request.negative_prompt;
}

bool has_negative_prompt(const PipelineRequest& request) {
  return request.negative_prompt.has_value() || !request.negative_prompts.empty() ||
         request.negative_prompt_embeds.defined();
}

void check_embedding_fields(const char* pipeline, const PipelineRequest& request) {
  const std::string name = pipeline;
  const bool given = request.prompt_embeds.defined(), negative = request.negative_prompt_embeds.defined();
  refuse(given && !request.prompt.empty(), "prompt_embeds",
         name + ": give either prompt or prompt_embeds, not both");
  refuse(given && (request.prompt_2.has_value() || request.prompt_3.has_value()), "prompt_2",
         name + ": prompt_2 and prompt_3 are prompts to encode; with prompt_embeds there are none");
  // A negative prompt left blank ("") is none: the embeddings stand for it.
  const auto given_text = [](const std::optional<std::string>& s) { return s.has_value() && !s->empty(); };
  refuse(negative && (given_text(request.negative_prompt) || !request.negative_prompts.empty() ||
                      given_text(request.negative_prompt_2) || given_text(request.negative_prompt_3)),
         "negative_prompt_embeds",
         name + ": give either negative_prompt or negative_prompt_embeds, not both");
  refuse(request.pooled_prompt_embeds.defined() && !given, "pooled_prompt_embeds",
         name + ": pooled_prompt_embeds go with prompt_embeds");
  refuse(request.negative_pooled_prompt_embeds.defined() && !negative, "negative_pooled_prompt_embeds",
         name + ": negative_pooled_prompt_embeds go with negative_prompt_embeds");
}

int64_t batch_size(const PipelineRequest& request) {
  const int64_t prompts = request.prompt_embeds.defined() && request.prompt_embeds.dim() >= 1
                              ? request.prompt_embeds.size(0)
                              : static_cast<int64_t>(std::max<size_t>(request.prompts.size(), 1));
  return prompts * request.num_images_per_prompt;
}

void check_prompt_list(const char* pipeline, const PipelineRequest& request) {
  const std::string name = pipeline;
  if (request.prompts.empty()) {
    refuse(
        !request.negative_prompts.empty(), "negative_prompts",
        name + ": negative_prompts go with a list of prompts (prompts); give negative_prompt for one prompt");
    return;
  }
  refuse(!request.prompt.empty(), "prompt", name + ": give either prompt or a list of prompts, not both");
  refuse(request.prompt_embeds.defined(), "prompt_embeds",
         name + ": give either prompt_embeds or a list of prompts, not both");
  refuse(
      request.prompt_2.has_value() || request.prompt_3.has_value(), "prompt_2",
      name +
          ": with a list of prompts every text encoder reads them (prompt_2 and prompt_3 take one prompt)");
  refuse(request.negative_prompt_2.has_value() || request.negative_prompt_3.has_value(), "negative_prompt_2",
         name +
             ": with a list of prompts every text encoder reads the negative prompts (negative_prompt_2 and "
             "negative_prompt_3 take one)");
  refuse(request.negative_prompt.has_value() && !request.negative_prompts.empty(), "negative_prompts",
         name + ": give either negative_prompt (for every prompt) or negative_prompts, not both");
  refuse(!request.negative_prompts.empty() && request.negative_prompts.size() != request.prompts.size(),
         "negative_prompts",
         name + ": " + std::to_string(request.negative_prompts.size()) + " negative prompts for " +
             std::to_string(request.prompts.size()) + " prompts (one each, or negative_prompt for all)");
  const int64_t images = static_cast<int64_t>(request.prompts.size()) * request.num_images_per_prompt;
  refuse(images > limits::kMaxImagesPerPrompt, "prompts",
         name + ": " + std::to_string(request.prompts.size()) + " prompts x " +
             std::to_string(request.num_images_per_prompt) + " images each make " + std::to_string(images) +
             " images, more than the maximum " + std::to_string(limits::kMaxImagesPerPrompt) + " per call");
  for (const std::string& p : request.prompts) check_prompt_size(pipeline, "prompts", p);
  for (const std::string& p : request.negative_prompts) check_prompt_size(pipeline, "negative_prompts", p);
}

void label_prompts(PipelineOutput& output, const PipelineRequest& request, bool negative) {
  if (request.prompts.empty()) return;
  const size_t n = static_cast<size_t>(request.num_images_per_prompt);
  for (size_t i = 0; i < output.images.size(); ++i) {
    output.images[i].metadata["prompt"] = request.prompts[i / n];
    if (negative)
      output.images[i].metadata["negative_prompt"] = negative_prompt_of(request, i / n).value_or("");
  }
}

namespace {

// Runs `check`, turning its kiln::Error into a RequestError naming `field`.
template <class Check>
void as_request_error(const char* field, Check check) {
  try {
    check();
  } catch (const RequestError&) {
    throw;
  } catch (const Error& e) {
    throw RequestError(field, e.what());
  }
}

}  // namespace

void check_image_size(const char* pipeline, int64_t height, int64_t width, int64_t multiple) {
  // The named limit first, so that an absurd side is refused as such before anything is sized from it.
  as_request_error("height", [&] {
    limits::check_range(std::string(pipeline) + ": height", height, 1, limits::kMaxImageSide);
  });
  as_request_error("width", [&] {
    limits::check_range(std::string(pipeline) + ": width", width, 1, limits::kMaxImageSide);
  });
  const bool height_ok = height > 0 && height % multiple == 0;
  if (!height_ok || width <= 0 || width % multiple != 0) {
    std::ostringstream message;
    message << pipeline << ": height and width must be positive multiples of " << multiple << ", got "
            << height << "x" << width;
    throw RequestError(height_ok ? "width" : "height", message.str());
  }
}

void check_steps(const char* pipeline, int num_inference_steps) {
  if (num_inference_steps < 1 || num_inference_steps > limits::kMaxInferenceSteps)
    throw RequestError("num_inference_steps", std::string(pipeline) +
                                                  ": num_inference_steps must be between 1 and 1000, got " +
                                                  std::to_string(num_inference_steps));
}

void check_prompt_size(const char* pipeline, const char* field, const std::string& prompt) {
  as_request_error(field, [&] { limits::check_prompt_size(std::string(pipeline) + ": " + field, prompt); });
}

void check_max_sequence_length(const char* pipeline, int64_t max_sequence_length) {
  if (max_sequence_length < 1 || max_sequence_length > 512)
    throw RequestError("max_sequence_length", std::string(pipeline) +
                                                  ": max_sequence_length must be between 1 and 512, got " +
                                                  std::to_string(max_sequence_length));
}

void check_images_per_prompt(const char* pipeline, int num_images_per_prompt) {
  if (num_images_per_prompt < 1 || num_images_per_prompt > limits::kMaxImagesPerPrompt)
    throw RequestError("num_images_per_prompt", std::string(pipeline) +
                                                    ": num_images_per_prompt must be between 1 and 64, got " +
                                                    std::to_string(num_images_per_prompt));
}

void check_guidance_scale(const char* pipeline, float guidance_scale, const char* field) {
  if (!std::isfinite(guidance_scale) || guidance_scale < 0) {
    std::ostringstream message;
    message << pipeline << ": " << field << " must be a finite value >= 0, got " << guidance_scale;
    throw RequestError(field, message.str());
  }
}

void check_strength(const char* pipeline, double strength, int num_inference_steps, bool whole_steps) {
  if (!(strength >= 0.0 && strength <= 1.0)) {
    std::ostringstream message;
    message << pipeline << ": strength must be in [0, 1], got " << strength;
    throw RequestError("strength", message.str());
  }
  if (num_inference_steps - first_step(num_inference_steps, strength, whole_steps) < 1) {
    std::ostringstream message;
    message << pipeline << ": strength " << strength << " leaves no step of " << num_inference_steps
            << " (it runs int(num_inference_steps * strength) steps, at least one is needed)";
    throw RequestError("strength", message.str());
  }
}

void check_edit_inputs(const char* pipeline, const PipelineRequest& request, bool with_mask) {
  // Latents to start from take the image's place (SDXL's hand-off); the class checks their channels.
  if (request.image_latents.defined()) {
    const Tensor& l = request.image_latents;
    refuse(!request.image.empty(), "image_latents",
           std::string(pipeline) +
               ": image_latents replace the image to start from: give one or the other, "
               "not both");
    refuse(l.dim() != 4 || !is_floating(l.dtype()) || l.numel() == 0, "image_latents",
           std::string(pipeline) +
               ": image_latents must be a floating-point array [batch, channels, height " +
               "/ scale, width / scale], got " + l.str());
  } else {
    refuse(request.image.size() != 1, "image",
           std::string(pipeline) + " takes one image to start from, got " +
               std::to_string(request.image.size()));
  }
  refuse(with_mask && !request.mask_image, "mask_image", std::string(pipeline) + " needs a mask_image");
}

std::optional<CropRegion> check_mask_crop(const char* pipeline, const PipelineRequest& request,
                                          int64_t height, int64_t width) {
  if (!request.padding_mask_crop) return std::nullopt;
  const int64_t pad = *request.padding_mask_crop;
  if (pad < 0 || pad > limits::kMaxImageSide)
    throw RequestError("padding_mask_crop",
                       std::string(pipeline) + ": padding_mask_crop must be between 0 and " +
                           std::to_string(limits::kMaxImageSide) + " pixels, got " + std::to_string(pad));
  refuse(request.output_type != OutputType::Image, "output_type",
         std::string(pipeline) +
             ": padding_mask_crop pastes the result back into the image, so the output "
             "must be images (not arrays or latents), as in diffusers");
  const Image& image = request.image.front();
  const Image& mask = *request.mask_image;
  if (mask.width != image.width || mask.height != image.height)
    throw RequestError("mask_image", std::string(pipeline) + ": with padding_mask_crop the mask_image (" +
                                         std::to_string(mask.width) + "x" + std::to_string(mask.height) +
                                         ") must have the image's size (" + std::to_string(image.width) +
                                         "x" + std::to_string(image.height) + ")");
  std::optional<CropRegion> region;
  as_request_error("mask_image", [&] { region = mask_crop_region(mask, width, height, pad); });
  return region;
}

Tensor postprocess(const Tensor& decoded) {
  const Tensor denorm = clamp(add(mul(decoded, 0.5), 0.5), 0.0, 1.0);
  // Images are written from the host (PNG, arrays): a device's result comes back here.
  return denorm.permute({0, 2, 3, 1}).to(float32).contiguous().to(cpu);
}

std::vector<Image> to_images(const Tensor& nhwc, const std::map<std::string, std::string>& metadata) {
  std::vector<Image> images;
  for (int64_t b = 0; b < nhwc.size(0); ++b) {
    Image image = Image::from_float(nhwc.select(0, b));
    image.metadata = metadata;
    image.metadata["software"] = "Kiln";
    images.push_back(std::move(image));
  }
  return images;
}

PipelineOutput make_output(OutputType type, const Tensor& nhwc,
                           const std::map<std::string, std::string>& metadata) {
  if (type == OutputType::Array) return {.array = nhwc};
  return {.images = to_images(nhwc, metadata)};
}

PipelineOutput make_output(const PipelineRequest& request, const Tensor& nhwc,
                           std::map<std::string, std::string> metadata,
                           const std::optional<CropRegion>& crop) {
  if (!crop) return make_output(request.output_type, nhwc, metadata);
  metadata["padding_mask_crop"] = std::to_string(*request.padding_mask_crop);
  PipelineOutput output = make_output(request.output_type, nhwc, metadata);
  for (Image& out : output.images) out = paste_back(*request.mask_image, request.image.front(), out, *crop);
  return output;
}

std::map<std::string, std::string> common_metadata(const std::string& model, const char* pipeline,
                                                   uint64_t seed, int steps, float guidance_scale,
                                                   int64_t height, int64_t width, DType dtype) {
  return {{"model", model},
          {"pipeline", pipeline},
          {"seed", std::to_string(seed)},
          {"steps", std::to_string(steps)},
          {"guidance_scale", std::to_string(guidance_scale)},
          {"height", std::to_string(height)},
          {"width", std::to_string(width)},
          {"dtype", std::string(dtype_name(dtype))}};
}

}  // namespace kiln::pipelines
