#include "kiln/families/qwen_image/qwen_image_pipeline.h"

#include <algorithm>

#include "families/family_helpers.h"
#include "families/qwen_image/qwen_image_guidance.h"
#include "families/qwen_image/qwen_image_single_file.h"
#include "kiln/core/log.h"
#include "kiln/families/qwen_image/autoencoder_kl_qwen_image.h"
#include "kiln/families/qwen_image/qwen2_vl_image_processor.h"
#include "kiln/families/qwen_image/qwen_image_transformer.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/qwen2_5_vl_vision.h"
#include "kiln/ops.h"
#include "kiln/pipelines/activation_estimate.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/schedulers/flow_match_euler.h"
#include "kiln/tokenizers/bpe_tokenizer.h"
#include "pipelines/call_control.h"
#include "pipelines/call_generators.h"
#include "pipelines/encoder_activations.h"
#include "pipelines/pipeline_common.h"
#include "pipelines/task_stages.h"

namespace kiln {

QwenImagePipeline::QwenImagePipeline() = default;
QwenImagePipeline::QwenImagePipeline(QwenImagePipeline&&) noexcept = default;
QwenImagePipeline& QwenImagePipeline::operator=(QwenImagePipeline&&) noexcept = default;
QwenImagePipeline::~QwenImagePipeline() = default;
QwenImagePipeline::QwenImagePipeline(const QwenImagePipeline& pipe, SharingComponents)
    : DiffusionPipeline(pipe, SharingComponents{}),
      tokenizer_(pipe.tokenizer_),
      text_encoder_(pipe.text_encoder_),
      transformer_(pipe.transformer_),
      vae_(pipe.vae_),
      scheduler_(pipe.scheduler_) {}

QwenImagePipeline QwenImagePipeline::from_pipe(const QwenImagePipeline& pipe) {
  return QwenImagePipeline(pipe, SharingComponents{});
}

QwenImageImg2ImgPipeline QwenImageImg2ImgPipeline::from_pipe(const QwenImagePipeline& pipe) {
  return QwenImageImg2ImgPipeline(pipe, SharingComponents{});
}
QwenImageInpaintPipeline QwenImageInpaintPipeline::from_pipe(const QwenImagePipeline& pipe) {
  return QwenImageInpaintPipeline(pipe, SharingComponents{});
}

QwenImagePipeline QwenImagePipeline::from_pretrained(const std::string& model,
                                                     const PipelineLoadOptions& options) {
  QwenImagePipeline pipe;
  load(pipe, model, options, "QwenImagePipeline");
  return pipe;
}

QwenImageImg2ImgPipeline QwenImageImg2ImgPipeline::from_pretrained(const std::string& model,
                                                                   const PipelineLoadOptions& options) {
  QwenImageImg2ImgPipeline pipe;
  load(pipe, model, options, "QwenImageImg2ImgPipeline");
  return pipe;
}

QwenImageInpaintPipeline QwenImageInpaintPipeline::from_pretrained(const std::string& model,
                                                                   const PipelineLoadOptions& options) {
  QwenImageInpaintPipeline pipe;
  load(pipe, model, options, "QwenImageInpaintPipeline");
  return pipe;
}

PipelineDefaults QwenImagePipeline::family_defaults() const {
  // guidance_scale is the guidance-distilled models' input, which no released Qwen-Image has (ignored).
  return {.num_inference_steps = 50, .guidance_scale = 1.0f, .max_sequence_length = 512};
}

PipelineDefaults QwenImageImg2ImgPipeline::family_defaults() const {
  return {.num_inference_steps = 50, .guidance_scale = 1.0f, .max_sequence_length = 512, .strength = 0.6};
}

PipelineDefaults QwenImageInpaintPipeline::family_defaults() const {
  return {.num_inference_steps = 50, .guidance_scale = 1.0f, .max_sequence_length = 512, .strength = 0.6};
}

void QwenImagePipeline::load(QwenImagePipeline& pipe, const std::string& model,
                             const PipelineLoadOptions& options, const char* pipeline_class) {
  // The editing classes read their own folders (Qwen-Image-Edit, -2509: the processor and Qwen2.5-VL's
  // vision tower beside the rest); the others each other's.
  const bool edits = std::string(pipeline_class) == "QwenImageEditPipeline" ||
                     std::string(pipeline_class) == "QwenImageEditPlusPipeline";
  const std::initializer_list<const char*> siblings = {"QwenImagePipeline", "QwenImageImg2ImgPipeline",
                                                       "QwenImageInpaintPipeline"};
  pipelines::PipelineFolder folder(model, options, pipeline_class,
                                   edits ? std::initializer_list<const char*>{} : siblings);
  folder.set_component_count(edits ? 6 : 5);
  pipe.path_ = folder.path();
  pipe.name_ = model;
  pipe.dtype_ = options.dtype;
  pipe.make_context(options, model);
  ExecutionScope loading_in(pipe.context());
  const auto done = [&](const char* name) { folder.loaded(name); };
  pipe.scheduler_ =
      std::make_unique<FlowMatchEulerDiscreteScheduler>(FlowMatchEulerDiscreteScheduler::from_pretrained(
          folder.need("scheduler", {"FlowMatchEulerDiscreteScheduler"})));
  done("scheduler");
  pipe.tokenizer_ = std::make_unique<tokenizers::BpeTokenizer>(tokenizers::BpeTokenizer::from_directory(
      folder.need("tokenizer", {"Qwen2Tokenizer", "Qwen2TokenizerFast"})));
  done("tokenizer");
  const std::vector<std::string>& splittable = find_pipeline_class(pipeline_class)->splittable_components;
  // hidden_states[-1]: every layer and the final norm.
  const std::string text_encoder = folder.need("text_encoder", {"Qwen2_5_VLForConditionalGeneration"});
  const auto text_config = models::DecoderTextEncoderConfig::from_file(text_encoder + "/config.json");
  KILN_CHECK(
      text_config.family == models::DecoderFamily::Qwen2_5_VL,
      text_encoder << ": Qwen-Image reads a Qwen2.5-VL text encoder; its config.json is another model");
  pipe.text_encoder_ =
      models::load_decoder_text_encoder(text_encoder, options.dtype, {text_config.num_hidden_layers},
                                        options.tensor_parallel_for("text_encoder", splittable));
  done("text_encoder");
  if (edits) {
    pipe.processor_ = std::make_shared<models::Qwen2VLImageProcessorConfig>(
        models::Qwen2VLImageProcessorConfig::from_folder(folder.need("processor", {"Qwen2VLProcessor"})));
    pipe.vision_ = models::load_qwen2_5_vl_vision(text_encoder, options.dtype);
    KILN_CHECK(
        pipe.vision_->config().out_hidden_size == text_config.hidden_size,
        text_encoder << ": the vision tower's out_hidden_size " << pipe.vision_->config().out_hidden_size
                     << " does not match the language model's hidden_size " << text_config.hidden_size);
    done("processor");
  }
  if (options.transformer_file.empty()) {
    pipe.transformer_ = models::load_qwen_image_transformer(
        folder.need("transformer", {"QwenImageTransformer2DModel"}), options.dtype,
        options.tensor_parallel_for("transformer", splittable));
  } else {
    // As ComfyUI ships it (or a GGUF of it), with the folder's config when it has one.
    pipe.transformer_ = models::load_qwen_image_single_file(
        options.transformer_file, single_file_transformer_config(folder.path(), options, pipeline_class),
        options.dtype);
  }
  done("transformer");
  pipe.vae_ =
      models::load_autoencoder_kl_qwen_image(folder.need("vae", {"AutoencoderKLQwenImage"}), options.dtype);
  done("vae");
  pipe.finish_loading(options.packed_weight_budget);
  const auto& tc = pipe.transformer_->config();
  KILN_CHECK(tc.joint_attention_dim == text_config.hidden_size,
             pipe.path_ << ": transformer joint_attention_dim " << tc.joint_attention_dim
                        << " does not match the text encoder's hidden_size " << text_config.hidden_size);
  const int64_t z_dim = pipe.vae_->config().z_dim;
  KILN_CHECK(tc.in_channels == 4 * z_dim && tc.out_channels == z_dim && tc.patch_size == 2,
             pipe.path_ << ": transformer in_channels " << tc.in_channels << ", out_channels "
                        << tc.out_channels << " and patch_size " << tc.patch_size
                        << " do not fit the vae's z_dim " << z_dim << " (expected " << 4 * z_dim << ", "
                        << z_dim << " and 2: 2 x 2 patches of the latents)");
}

std::string QwenImagePipeline::template_prompt(const std::string& prompt) {
  return "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
         "text, "
         "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n" +
         prompt + "<|im_end|>\n<|im_start|>assistant\n";
}

std::vector<int64_t> QwenImagePipeline::tokenize(const std::string& prompt) const {
  tokenizers::BpeEncodeOptions options;
  options.max_length = kMaxSequenceLength + kTemplateTokens;
  options.pad_to_max_length = false;
  return tokenizer_->encode(template_prompt(prompt), options).ids;
}

Tensor QwenImagePipeline::prompt_features(const std::vector<int64_t>& ids, int64_t drop,
                                          int64_t max_sequence_length,
                                          const models::MultimodalInputs* images) const {
  const auto length = static_cast<int64_t>(ids.size());
  KILN_CHECK(length > drop, class_name() << ": the templated prompt has " << length
                                         << " tokens, no more than the template's first " << drop
                                         << " that are dropped");
  if (length - drop > max_sequence_length)
    warn("the prompt is longer than max_sequence_length (" + std::to_string(max_sequence_length) +
         " tokens) and was truncated");
  // Each prompt alone: its padding would sit on the right under a causal mask, so its own tokens give the
  // states diffusers' padded batch gives them.
  const Tensor states =
      text_encoder_
          ->hidden_states(Tensor::from_vector(ids, {1, length}), Tensor::full({1, length}, 1.0, int64),
                          {text_encoder_->config().num_hidden_layers}, images)[0]
          .select(0, 0);
  return states.narrow(0, drop, std::min(length - drop, max_sequence_length));
}

std::pair<Tensor, Tensor> QwenImagePipeline::batched_features(const std::vector<Tensor>& features, int n) {
  int64_t longest = 0;
  for (const Tensor& f : features) longest = std::max(longest, f.size(0));
  std::vector<Tensor> rows;
  std::vector<int64_t> mask;
  bool padded = false;
  for (const Tensor& f : features) {
    const int64_t length = f.size(0);
    Tensor row = f;
    if (length < longest) {
      row = concat({f, Tensor::zeros({longest - length, f.size(1)}, f.dtype())}, 0);
      padded = true;
    }
    for (int k = 0; k < n; ++k) {
      rows.push_back(row.unsqueeze(0));
      for (int64_t i = 0; i < longest; ++i) mask.push_back(i < length ? 1 : 0);
    }
  }
  const auto batch = static_cast<int64_t>(rows.size());
  return {concat(rows, 0), padded ? Tensor::from_vector(mask, {batch, longest}) : Tensor()};
}

std::pair<Tensor, Tensor> QwenImagePipeline::encode_prompt(const std::vector<std::string>& prompts, int n,
                                                           int64_t max_sequence_length) const {
  std::vector<Tensor> features;
  for (const std::string& prompt : prompts)
    features.push_back(prompt_features(tokenize(prompt), kTemplateTokens, max_sequence_length));
  return batched_features(features, n);
}

QwenImagePipeline::CallText QwenImagePipeline::encode_call(
    const PipelineRequest& request,
    const std::function<std::pair<Tensor, Tensor>(const std::vector<std::string>&)>& encode) const {
  if (request.guidance_scale)
    warn(std::string(class_name()) +
         ": guidance_scale is ignored (the transformer is not guidance-distilled; true_cfg_scale with a "
         "negative_prompt guides), as in diffusers");
  const qwen_image::TrueCfg cfg = qwen_image::true_cfg_of(class_name(), request);
  CallText text{.true_cfg = cfg.enabled, .true_cfg_scale = cfg.scale};
  const std::vector<std::string> prompts = pipelines::prompt_list(request);
  std::tie(text.embeds, text.mask) = encode(prompts);
  if (cfg.enabled) {
    std::vector<std::string> negatives;
    for (size_t i = 0; i < prompts.size(); ++i)
      negatives.push_back(pipelines::negative_prompt_of(request, i).value_or(""));
    std::tie(text.negative_embeds, text.negative_mask) = encode(negatives);
  }
  return text;
}

bool QwenImagePipeline::negative_evaluations(const PipelineRequest& request) const {
  return qwen_image::true_cfg_enabled(request);
}

void QwenImagePipeline::check_loaded_request(const PipelineRequest& request) const {
  // Without height and width, diffusers' 1024 x 1024, whatever the size of an image to edit.
  check_call(request, pipelines::resolve(request, defaults()));
}

void QwenImagePipeline::check_call(const PipelineRequest& request,
                                   const pipelines::ResolvedRequest& r) const {
  const std::string name = class_name();
  pipelines::check_image_size(name.c_str(), r.height, r.width, vae_->config().scale_factor() * 2);
  pipelines::check_task_inputs(registered_class().task, name.c_str(), request, r);
  if (r.max_sequence_length > kMaxSequenceLength)
    throw RequestError("max_sequence_length", name + ": max_sequence_length " +
                                                  std::to_string(r.max_sequence_length) +
                                                  " is more than the " + std::to_string(kMaxSequenceLength) +
                                                  " tokens Qwen-Image reads");
}

PipelineOutput QwenImagePipeline::run(const PipelineRequest& request, const pipelines::CallControl& control) {
  const pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  const CallText text = encode_call(request, [&](const std::vector<std::string>& prompts) {
    return encode_prompt(prompts, request.num_images_per_prompt, call.max_sequence_length);
  });
  return denoise(request, call, text, Tensor(), {}, control);
}

PipelineOutput QwenImagePipeline::denoise(const PipelineRequest& request,
                                          const pipelines::ResolvedRequest& call, const CallText& text,
                                          const Tensor& context,
                                          const std::vector<models::QwenImageShape>& context_shapes,
                                          const pipelines::CallControl& control) {
  release_after_use({{"text_encoder", text_encoder_.get()}, {"vision_encoder", vision_.get()}});
  const int64_t multiple = vae_->config().scale_factor() * 2;
  pipelines::CallGenerators generators(request);
  const int64_t batch = pipelines::batch_size(request);
  const DType dtype = text.embeds.dtype();
  const int64_t h = 2 * (call.height / multiple), w = 2 * (call.width / multiple);
  std::vector<models::QwenImageShape> img_shapes = {{.frames = 1, .height = h / 2, .width = w / 2}};
  img_shapes.insert(img_shapes.end(), context_shapes.begin(), context_shapes.end());

  // The call's own schedule, shifted by the noise's token count.
  FlowMatchEulerDiscreteScheduler schedule = *scheduler_;
  schedule.set_timesteps(call.num_inference_steps, flux_sigmas(call.num_inference_steps),
                         calculate_shift(schedule.config(), (h / 2) * (w / 2)));

  // The latents live in the prompt's dtype, packed as 2 x 2 patches (drawn as [B, 1, C, h, w]: the same
  // numbers as [B, C, h, w]).
  const pipelines::TaskCall task{
      .task = registered_class().task,
      .pipeline = class_name(),
      .request = request,
      .call = call,
      .batch = batch,
      .dtype = dtype,
      .generators = generators,
      .schedule = schedule,
      .codec = *vae_,
      .pack = [](const Tensor& latents) { return models::flux_pack_latents(latents); }};
  const pipelines::TaskStart start = pipelines::start_latents(task);

  // denoise, decode
  const auto model_output = [&](const Tensor& x, int, float timestep) {
    // diffusers: t.expand(B).to(latents.dtype) / 1000, in the latents' dtype.
    const Tensor t = div(Tensor::full({batch}, timestep, float32).to(x.dtype()), 1000.0);
    // The image to edit: its tokens after the noise's, their prediction dropped.
    const Tensor input = context.defined() ? concat({x, context.to(x.device())}, 1) : x;
    const auto predict = [&](const Tensor& embeds, const Tensor& mask) {
      const Tensor out = transformer_->forward(input, embeds, mask, t, img_shapes);
      return context.defined() ? out.narrow(1, 0, x.size(1)) : out;
    };
    const Tensor positive = predict(text.embeds, text.mask);
    if (!text.true_cfg) return positive;
    cache_context("uncond");
    const Tensor negative = predict(text.negative_embeds, text.negative_mask);
    cache_context("cond");
    return qwen_image::norm_rescaled_cfg(positive, negative, text.true_cfg_scale);
  };
  std::map<std::string, std::string> extra;
  if (text.true_cfg) extra["true_cfg_scale"] = std::to_string(text.true_cfg_scale);
  return denoise_and_decode(
      task, start, model_output,
      [&](const Tensor& latents) {
        const Tensor unpacked = models::flux_unpack_latents(latents, h, w).to(dtype_);
        return pipelines::postprocess(vae_->decode(vae_->from_latents(unpacked)));
      },
      text.true_cfg, std::move(extra), control);
}

std::vector<std::pair<std::string, nn::Module*>> QwenImagePipeline::components() const {
  std::vector<std::pair<std::string, nn::Module*>> out = {{"text_encoder", text_encoder_.get()}};
  if (vision_) out.emplace_back("vision_encoder", vision_.get());  // the editing classes'
  out.insert(out.end(), {{"transformer", transformer_.get()}, {"vae", vae_.get()}});
  return out;
}

models::LatentCodec& QwenImagePipeline::latent_codec() const {
  return *vae_;
}

nn::Module& QwenImagePipeline::denoiser() {
  return *transformer_;
}

ActivationEstimate QwenImagePipeline::estimate_activations(const PipelineRequest& request,
                                                           const Device& device) const {
  const int64_t multiple = vae_->config().scale_factor() * 2;
  const pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  const models::QwenImageTransformerConfig& tc = transformer_->config();
  const models::DecoderTextEncoderConfig& te = text_encoder_->config();
  const int64_t batch = pipelines::batch_size(request);
  const int64_t image_tokens = (call.height / multiple) * (call.width / multiple);
  ActivationEstimate e{.height = call.height, .width = call.width};
  // Each prompt alone under a causal mask (no fused attention), the template's tokens with it.
  e.text_encoders =
      block_stack_activation_bytes({.tokens = call.max_sequence_length + kTemplateTokens,
                                    .width = std::max(te.hidden_size, te.num_attention_heads * te.head_dim),
                                    .mlp_width = te.intermediate_size,
                                    .heads = te.num_attention_heads,
                                    .fused_attention = false},
                                   dtype());
  // True CFG runs two calls of batch B, one after the other.
  e.transformer =
      pipelines::dit_step_activation_bytes(batch, image_tokens + call.max_sequence_length,
                                           tc.num_attention_heads, tc.attention_head_dim, dtype(), device);
  e.vae = qwen_image::vae_activation_bytes(vae_->config(), batch, call.height, call.width, dtype());
  return e;
}

}  // namespace kiln
