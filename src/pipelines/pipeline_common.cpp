#include "pipelines/pipeline_common.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "kiln/core/device_runtime.h"
#include "kiln/core/limits.h"
#include "kiln/io/model_ref.h"
#include "kiln/ops.h"
#include "kiln/runtime/execution_context.h"
#include "kiln/schedulers/flow_match_euler.h"

namespace kiln::pipelines {

namespace fs = std::filesystem;

PipelineFolder::PipelineFolder(const std::string& model, const PipelineLoadOptions& options,
                               const char* pipeline_class)
    : on_loaded_(options.on_component_loaded) {
  KILN_CHECK(options.dtype == float32 || options.dtype == bfloat16 || options.dtype == float16,
             pipeline_class << ": dtype " << dtype_name(options.dtype)
                            << " is not supported (expected f32, bf16 or f16)");
  io::ResolveOptions resolve;
  resolve.revision = options.revision;
  path_ = io::resolve_model(model, resolve).path;
  index_ = io::load_model_index(path_);
  KILN_CHECK(index_.class_name == pipeline_class, index_.path << ": pipeline class is '" << index_.class_name
                                                              << "', but this is " << pipeline_class);
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

void check_image_size(const char* pipeline, int64_t height, int64_t width, int64_t multiple) {
  // The named limit first, so that an absurd side is refused as such before anything is sized from it.
  limits::check_range(std::string(pipeline) + ": height", height, 1, limits::kMaxImageSide);
  limits::check_range(std::string(pipeline) + ": width", width, 1, limits::kMaxImageSide);
  KILN_CHECK(height > 0 && width > 0 && height % multiple == 0 && width % multiple == 0,
             pipeline << ": height and width must be positive multiples of " << multiple << ", got " << height
                      << "x" << width);
}

void check_steps(const char* pipeline, int num_inference_steps) {
  KILN_CHECK(num_inference_steps >= 1 && num_inference_steps <= limits::kMaxInferenceSteps,
             pipeline << ": num_inference_steps must be between 1 and 1000, got " << num_inference_steps);
}

void check_prompt_size(const char* pipeline, const char* argument, const std::string& prompt) {
  limits::check_prompt_size(std::string(pipeline) + ": " + argument, prompt);
}

void check_max_sequence_length(const char* pipeline, int64_t max_sequence_length) {
  KILN_CHECK(max_sequence_length >= 1 && max_sequence_length <= 512,
             pipeline << ": max_sequence_length must be between 1 and 512, got " << max_sequence_length);
}

void check_images_per_prompt(const char* pipeline, int num_images_per_prompt) {
  KILN_CHECK(num_images_per_prompt >= 1 && num_images_per_prompt <= limits::kMaxImagesPerPrompt,
             pipeline << ": num_images_per_prompt must be between 1 and 64, got " << num_images_per_prompt);
}

void check_guidance_scale(const char* pipeline, float guidance_scale) {
  KILN_CHECK(std::isfinite(guidance_scale) && guidance_scale >= 0,
             pipeline << ": guidance_scale must be a finite value >= 0, got " << guidance_scale);
}

void denoise(const FlowMatchEulerDiscreteScheduler& scheduler, Tensor& latents,
             const std::function<Tensor(const Tensor&, int, float)>& velocity,
             const std::function<void(int, int, double)>& on_step_end) {
  const auto& timesteps = scheduler.timesteps();
  for (size_t i = 0; i < timesteps.size(); ++i) {
    const auto start = std::chrono::steady_clock::now();
    const Tensor v = velocity(latents, static_cast<int>(i), timesteps[i]);
    latents = scheduler.step(v, static_cast<int>(i), latents);
    synchronize(latents.device());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (on_step_end) on_step_end(static_cast<int>(i), static_cast<int>(timesteps.size()), seconds);
  }
}

Tensor postprocess(const Tensor& decoded) {
  const Tensor denorm = clamp(add(mul(decoded, 0.5), 0.5), 0.0, 1.0);
  return denorm.permute({0, 2, 3, 1}).to(float32).contiguous();
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
