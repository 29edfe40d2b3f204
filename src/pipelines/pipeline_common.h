// The skeleton the pipelines share: opening a diffusers pipeline folder (model_index.json, the component
// folders and their classes, the loading progress), a request's defaults and the checks every call makes,
// the VAE output's postprocessing, and the images with their PNG metadata. The denoising loop is
// pipelines/denoise.h.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/io/model_index.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "pipelines/mask_crop.h"

namespace kiln::pipelines {

// A pipeline folder being loaded: a diffusers folder or a repo id in the local Hugging Face cache whose
// model_index.json names `pipeline_class`.
class PipelineFolder {
 public:
  // Throws kiln::Error for a dtype the pipelines do not run (f32, bf16 and f16 only), a folder that cannot be
  // resolved, or a pipeline class other than `pipeline_class` and the `compatible` ones (folders with the
  // same components: FluxImg2ImgPipeline loads a FluxPipeline folder, as diffusers lets it).
  PipelineFolder(const std::string& model, const PipelineLoadOptions& options, const char* pipeline_class,
                 std::initializer_list<const char*> compatible = {});
  const std::string& path() const { return path_; }
  const io::ModelIndex& index() const { return index_; }
  // Whether model_index.json lists `name` with a class (not [null, null]).
  bool present(const char* name) const;
  // The folder of component `name`, which must be present, have one of `classes` (the first is the one
  // named in errors) and exist.
  std::string need(const char* name, std::initializer_list<const char*> classes) const;
  // How many loading steps on_component_loaded counts (it may depend on the components present).
  void set_component_count(int count) { count_ = count; }
  // Reports that `name` finished loading (PipelineLoadOptions::on_component_loaded).
  void loaded(const char* name);

 private:
  std::string path_;
  io::ModelIndex index_;
  std::function<void(const std::string&, int, int)> on_loaded_;
  int count_ = 0, done_ = 0;
};

// A request with the pipeline's defaults filled in.
struct ResolvedRequest {
  int64_t height = 0, width = 0;
  int num_inference_steps = 0;
  float guidance_scale = 0;
  int64_t max_sequence_length = 0;
  double strength = 1.0;
};
ResolvedRequest resolve(const PipelineRequest& request, const PipelineDefaults& defaults);
// The same for a class that edits an image (`edits`): without height and width, the image's own size, each
// side rounded down to a multiple of `multiple` (VaeImageProcessor's default height and width).
ResolvedRequest resolve_with_image_size(const PipelineRequest& request, const PipelineDefaults& defaults,
                                        bool edits, int64_t multiple);

// Field refusals: a pipeline that does not take `field` throws RequestError(field, "<pipeline> <why>") when
// the request sets it.
void refuse(bool given, const char* field, const std::string& message);
// x.repeat(1, n, ...).view(B * n, ...): each of the B rows n times in a row (num_images_per_prompt).
Tensor repeat_per_prompt(const Tensor& x, int n);
// The request's given embeddings, where it has them (FLUX.1, SD3): prompt_embeds [B, L, width] with
// 1 <= L <= max_tokens and pooled_prompt_embeds [B, pooled_width], floating point; the negative ones alike,
// one row per prompt; each error a RequestError naming the field and the shape expected.
void check_given_embeddings(const char* pipeline, const PipelineRequest& request, int64_t width,
                            int64_t max_tokens, int64_t pooled_width);

// The call's prompts: `prompts` when given, else {prompt}.
std::vector<std::string> prompt_list(const PipelineRequest& request);
// Prompt i's negative prompt: negative_prompts[i] when given, else negative_prompt (unset when neither is).
std::optional<std::string> negative_prompt_of(const PipelineRequest& request, size_t i);
// Whether the call gives a negative prompt (negative_prompt, negative_prompts or negative_prompt_embeds).
bool has_negative_prompt(const PipelineRequest& request);
// The field checks of prompt_embeds and negative_prompt_embeds and their pooled companions: not beside the
// prompts they replace; a pooled one only with its embeddings.
void check_embedding_fields(const char* pipeline, const PipelineRequest& request);
// The images a call makes: its prompts times num_images_per_prompt.
int64_t batch_size(const PipelineRequest& request);
// The checks of `prompts` and `negative_prompts` (not beside prompt, prompt_2, prompt_embeds; one negative
// prompt each) and of every prompt's size.
void check_prompt_list(const char* pipeline, const PipelineRequest& request);
// With `prompts`: each image's "prompt" (and "negative_prompt" when `negative`) metadata is its own prompt's.
void label_prompts(PipelineOutput& output, const PipelineRequest& request, bool negative);

// The checks every pipeline call makes, each a RequestError naming the pipeline, the field and what it
// accepts.
void check_image_size(const char* pipeline, int64_t height, int64_t width, int64_t multiple);
void check_steps(const char* pipeline, int num_inference_steps);
// A prompt's size in bytes against limits::kMaxPromptBytes, naming the pipeline and the field.
void check_prompt_size(const char* pipeline, const char* field, const std::string& prompt);
void check_max_sequence_length(const char* pipeline, int64_t max_sequence_length);
void check_images_per_prompt(const char* pipeline, int num_images_per_prompt);
void check_guidance_scale(const char* pipeline, float guidance_scale, const char* field = "guidance_scale");
// strength in [0, 1], and a schedule of `num_inference_steps` it leaves at least one step of (counted as
// first_step counts them, `whole_steps` or not).
void check_strength(const char* pipeline, double strength, int num_inference_steps, bool whole_steps = false);
// The one image an editing pipeline starts from (request.image), and the mask when `with_mask`.
void check_edit_inputs(const char* pipeline, const PipelineRequest& request, bool with_mask);

// padding_mask_crop's checks (a pad in [0, kMaxImageSide], images as the output, a mask of the image's size
// with something to repaint) and its region (mask_crop_region), or nothing when the request has none. Call
// after check_edit_inputs.
std::optional<CropRegion> check_mask_crop(const char* pipeline, const PipelineRequest& request,
                                          int64_t height, int64_t width);

// VaeImageProcessor.postprocess: (x * 0.5 + 0.5).clamp(0, 1) in the VAE output's dtype, then NHWC float32
// [B, H, W, C] (diffusers' output_type="np").
Tensor postprocess(const Tensor& decoded);

// One 8-bit image per batch element of `nhwc`, each with `metadata` plus "software" (the PNG's text chunks).
std::vector<Image> to_images(const Tensor& nhwc, const std::map<std::string, std::string>& metadata);
// A call's output from the decoded NHWC float32 images: the images (to_images) or the array itself.
PipelineOutput make_output(OutputType type, const Tensor& nhwc,
                           const std::map<std::string, std::string>& metadata);

// The same for an inpainting call: with padding_mask_crop's region, each image pasted back into the request's
// image (paste_back) and the padding recorded in the metadata.
PipelineOutput make_output(const PipelineRequest& request, const Tensor& nhwc,
                           std::map<std::string, std::string> metadata,
                           const std::optional<CropRegion>& crop);

// The metadata every pipeline records: model, pipeline, seed, steps, guidance scale, size, dtype.
std::map<std::string, std::string> common_metadata(const std::string& model, const char* pipeline,
                                                   uint64_t seed, int steps, float guidance_scale,
                                                   int64_t height, int64_t width, DType dtype);

}  // namespace kiln::pipelines
