#include "kiln/families/sd3/sd3_pipeline.h"

#include <cmath>
#include <filesystem>

#include "kiln/core/limits.h"
#include "kiln/core/log.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/models/t5_encoder.h"
#include "kiln/ops.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/schedulers/flow_match_euler.h"
#include "kiln/schedulers/timestep_shift.h"
#include "kiln/tokenizers/clip_tokenizer.h"
#include "kiln/tokenizers/t5_tokenizer.h"
#include "pipelines/call_control.h"
#include "pipelines/call_generators.h"
#include "pipelines/denoise.h"
#include "pipelines/encoder_activations.h"
#include "pipelines/image_processor.h"
#include "pipelines/pipeline_common.h"
#include "pipelines/task_stages.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

constexpr const char* kName = "StableDiffusion3Pipeline";

// Python's `a or b` for optional strings: an absent or empty string falls back.
std::string or_else(const std::optional<std::string>& value, const std::string& fallback) {
  return value && !value->empty() ? *value : fallback;
}

}  // namespace

StableDiffusion3Pipeline::StableDiffusion3Pipeline() = default;
StableDiffusion3Pipeline::StableDiffusion3Pipeline(StableDiffusion3Pipeline&&) noexcept = default;
StableDiffusion3Pipeline& StableDiffusion3Pipeline::operator=(StableDiffusion3Pipeline&&) noexcept = default;
StableDiffusion3Pipeline::~StableDiffusion3Pipeline() = default;
StableDiffusion3Pipeline::StableDiffusion3Pipeline(const StableDiffusion3Pipeline& pipe, SharingComponents)
    : DiffusionPipeline(pipe, SharingComponents{}),
      tokenizer_(pipe.tokenizer_),
      tokenizer_2_(pipe.tokenizer_2_),
      tokenizer_3_(pipe.tokenizer_3_),
      text_encoder_(pipe.text_encoder_),
      text_encoder_2_(pipe.text_encoder_2_),
      text_encoder_3_(pipe.text_encoder_3_),
      transformer_(pipe.transformer_),
      vae_(pipe.vae_),
      scheduler_(pipe.scheduler_) {}

StableDiffusion3Pipeline StableDiffusion3Pipeline::from_pipe(const StableDiffusion3Pipeline& pipe) {
  return StableDiffusion3Pipeline(pipe, SharingComponents{});
}
StableDiffusion3Img2ImgPipeline StableDiffusion3Img2ImgPipeline::from_pipe(
    const StableDiffusion3Pipeline& pipe) {
  return StableDiffusion3Img2ImgPipeline(pipe, SharingComponents{});
}
StableDiffusion3InpaintPipeline StableDiffusion3InpaintPipeline::from_pipe(
    const StableDiffusion3Pipeline& pipe) {
  return StableDiffusion3InpaintPipeline(pipe, SharingComponents{});
}

StableDiffusion3Pipeline StableDiffusion3Pipeline::from_pretrained(const std::string& model,
                                                                   const PipelineLoadOptions& options) {
  StableDiffusion3Pipeline pipe;
  load(pipe, model, options, kName);
  return pipe;
}

StableDiffusion3Img2ImgPipeline StableDiffusion3Img2ImgPipeline::from_pretrained(
    const std::string& model, const PipelineLoadOptions& options) {
  StableDiffusion3Img2ImgPipeline pipe;
  load(pipe, model, options, "StableDiffusion3Img2ImgPipeline");
  return pipe;
}

StableDiffusion3InpaintPipeline StableDiffusion3InpaintPipeline::from_pretrained(
    const std::string& model, const PipelineLoadOptions& options) {
  StableDiffusion3InpaintPipeline pipe;
  load(pipe, model, options, "StableDiffusion3InpaintPipeline");
  return pipe;
}

void StableDiffusion3Pipeline::load(StableDiffusion3Pipeline& pipe, const std::string& model,
                                    const PipelineLoadOptions& options, const char* pipeline_class) {
  // The three pipelines read the same components, so each loads the others' folders, as diffusers lets it.
  pipelines::PipelineFolder folder(
      model, options, pipeline_class,
      {kName, "StableDiffusion3Img2ImgPipeline", "StableDiffusion3InpaintPipeline"});
  auto present = [&](const char* name) { return folder.present(name); };
  auto need = [&](const char* name, std::initializer_list<const char*> classes) {
    return folder.need(name, classes);
  };
  const bool with_t5 = present("text_encoder_3");
  KILN_CHECK(with_t5 == present("tokenizer_3"),
             folder.index().path << ": text_encoder_3 and tokenizer_3 must both be present or both absent");

  pipe.path_ = folder.path();
  pipe.name_ = model;
  pipe.dtype_ = options.dtype;
  pipe.make_context(options, model);
  ExecutionScope loading_in(pipe.context());
  folder.set_component_count(with_t5 ? 9 : 7);
  const std::vector<std::string>& splittable = find_pipeline_class(pipeline_class)->splittable_components;
  auto done = [&](const char* name) { folder.loaded(name); };
  pipe.scheduler_ =
      std::make_unique<FlowMatchEulerDiscreteScheduler>(FlowMatchEulerDiscreteScheduler::from_pretrained(
          need("scheduler", {"FlowMatchEulerDiscreteScheduler"})));
  done("scheduler");
  pipe.tokenizer_ = std::make_unique<tokenizers::ClipTokenizer>(
      tokenizers::ClipTokenizer::from_directory(need("tokenizer", {"CLIPTokenizer", "CLIPTokenizerFast"})));
  done("tokenizer");
  pipe.tokenizer_2_ = std::make_unique<tokenizers::ClipTokenizer>(
      tokenizers::ClipTokenizer::from_directory(need("tokenizer_2", {"CLIPTokenizer", "CLIPTokenizerFast"})));
  done("tokenizer_2");
  if (with_t5) {
    pipe.tokenizer_3_ = std::make_unique<tokenizers::T5Tokenizer>(
        tokenizers::T5Tokenizer::from_directory(need("tokenizer_3", {"T5TokenizerFast", "T5Tokenizer"})));
    done("tokenizer_3");
  }
  pipe.text_encoder_ =
      models::load_clip_text_model(need("text_encoder", {"CLIPTextModelWithProjection"}), options.dtype);
  done("text_encoder");
  pipe.text_encoder_2_ =
      models::load_clip_text_model(need("text_encoder_2", {"CLIPTextModelWithProjection"}), options.dtype);
  done("text_encoder_2");
  if (with_t5) {
    pipe.text_encoder_3_ = models::load_t5_encoder(need("text_encoder_3", {"T5EncoderModel"}), options.dtype,
                                                   options.tensor_parallel_for("text_encoder_3", splittable));
    done("text_encoder_3");
  }
  if (options.transformer_file.empty()) {
    pipe.transformer_ =
        models::load_sd3_transformer(need("transformer", {"SD3Transformer2DModel"}), options.dtype,
                                     options.tensor_parallel_for("transformer", splittable));
  } else {  // described by the model's transformer/config.json, as diffusers' from_single_file(config=...)
    KILN_CHECK(
        options.parallel_config.count("transformer") == 0,
        "StableDiffusion3Pipeline: a single-file transformer cannot be split across ranks yet; load it "
        "without tensor parallelism or from a diffusers folder");
    pipe.transformer_ = models::SD3Transformer2DModel::from_single_file(
        options.transformer_file, (fs::path(folder.path()) / "transformer" / "config.json").string(),
        options.dtype);
  }
  done("transformer");
  pipe.vae_ = models::load_autoencoder_kl(need("vae", {"AutoencoderKL"}), options.dtype);
  done("vae");
  pipe.finish_loading(options.packed_weight_budget);

  const auto& tc = pipe.transformer_->config();
  const auto& l = pipe.text_encoder_->config();
  const auto& g = pipe.text_encoder_2_->config();
  KILN_CHECK(l.with_projection && g.with_projection,
             pipe.path_ << ": text_encoder and text_encoder_2 must be CLIPTextModelWithProjection");
  KILN_CHECK(tc.pooled_projection_dim == l.projection_dim + g.projection_dim,
             pipe.path_ << ": transformer pooled_projection_dim " << tc.pooled_projection_dim
                        << " is not the sum of the CLIP projection dims " << l.projection_dim << " + "
                        << g.projection_dim);
  KILN_CHECK(l.hidden_size + g.hidden_size <= tc.joint_attention_dim,
             pipe.path_ << ": the CLIP hidden sizes " << l.hidden_size << " + " << g.hidden_size
                        << " exceed the transformer's joint_attention_dim " << tc.joint_attention_dim);
  if (with_t5)
    KILN_CHECK(tc.joint_attention_dim == pipe.text_encoder_3_->config().d_model,
               pipe.path_ << ": transformer joint_attention_dim " << tc.joint_attention_dim
                          << " does not match text_encoder_3 d_model "
                          << pipe.text_encoder_3_->config().d_model);
  KILN_CHECK(tc.in_channels == pipe.vae_->config().latent_channels,
             pipe.path_ << ": transformer in_channels " << tc.in_channels
                        << " is not the VAE's latent_channels " << pipe.vae_->config().latent_channels);
}

int64_t StableDiffusion3Pipeline::default_image_size() const {
  return transformer_->config().sample_size * vae_->config().scale_factor();
}

StableDiffusion3Pipeline::TextEmbeddings StableDiffusion3Pipeline::encode_text(
    const std::string& prompt, const std::string& prompt_2, const std::string& prompt_3,
    int num_images_per_prompt, int64_t max_sequence_length) const {
  TextEmbeddings out;
  // Both CLIP towers use the first tokenizer's model_max_length (77), as diffusers' tokenizer_max_length.
  const int64_t clip_max = tokenizer_->model_max_length();
  tokenizers::EncodeOptions clip_options;
  clip_options.max_length = clip_max;
  // CLIP: projected pooled vector (text_embeds) and the penultimate layer's hidden states, without the final
  // layer norm and without a padding mask (pads attend causally, as in diffusers).
  auto clip = [&](const tokenizers::ClipTokenizer& tokenizer, const models::ClipTextModel& encoder,
                  const std::string& text, std::vector<int64_t>& ids, Tensor& hidden, Tensor& pooled) {
    if (static_cast<int64_t>(tokenizer.tokenize(text).size()) + 2 > clip_max)
      warn("the prompt is longer than CLIP's " + std::to_string(clip_max) +
           " tokens and was truncated for CLIP");
    ids = tokenizer.encode(text, clip_options).ids;
    const models::ClipTextOutput o =
        encoder.forward(Tensor::from_vector(ids, {1, static_cast<int64_t>(ids.size())}), true);
    hidden = o.hidden_states.at(o.hidden_states.size() - 2).to(dtype_);
    pooled = o.pooled;
  };
  clip(*tokenizer_, *text_encoder_, prompt, out.clip_l_ids, out.clip_l_hidden, out.clip_l_pooled);
  clip(*tokenizer_2_, *text_encoder_2_, prompt_2, out.clip_g_ids, out.clip_g_hidden, out.clip_g_pooled);

  const int64_t joint = transformer_->config().joint_attention_dim;
  if (text_encoder_3_) {
    if (static_cast<int64_t>(tokenizer_3_->tokenize(prompt_3).size()) + 1 > max_sequence_length)
      warn("the prompt is longer than max_sequence_length (" + std::to_string(max_sequence_length) +
           " tokens) and was truncated for T5");
    tokenizers::EncodeOptions t5_options;
    t5_options.max_length = max_sequence_length;
    out.t5_ids = tokenizer_3_->encode(prompt_3, t5_options).ids;
    // No attention mask: every token, pads included, attends to all positions.
    out.t5_hidden = text_encoder_3_->forward(
        Tensor::from_vector(out.t5_ids, {1, static_cast<int64_t>(out.t5_ids.size())}));
  } else {
    out.t5_hidden = Tensor::zeros({1, max_sequence_length, joint}, dtype_, out.clip_l_hidden.device());
  }

  // [CLIP-L | CLIP-G] features, zero-padded on the right to T5's width, then stacked before the T5 tokens.
  const Tensor clip_seq = concat({out.clip_l_hidden, out.clip_g_hidden}, 2);
  const int64_t pad = out.t5_hidden.size(2) - clip_seq.size(2);
  const Tensor clip_padded =
      pad > 0
          ? concat({clip_seq, Tensor::zeros({1, clip_seq.size(1), pad}, clip_seq.dtype(), clip_seq.device())},
                   2)
          : clip_seq;
  out.prompt_embeds = concat({clip_padded, out.t5_hidden}, 1);
  out.pooled_prompt_embeds = concat({out.clip_l_pooled, out.clip_g_pooled}, 1);

  const int n = num_images_per_prompt;
  for (Tensor* t : {&out.prompt_embeds, &out.pooled_prompt_embeds, &out.clip_l_hidden, &out.clip_l_pooled,
                    &out.clip_g_hidden, &out.clip_g_pooled, &out.t5_hidden})
    *t = pipelines::repeat_per_prompt(*t, n);
  return out;
}

namespace {

// Several prompts' embeddings as one batch, in order (diffusers encodes a prompt list as one batch; each
// prompt's rows are its own encoding). The token ids stay the first prompt's.
StableDiffusion3Pipeline::TextEmbeddings concat_batch(
    std::vector<StableDiffusion3Pipeline::TextEmbeddings> all) {
  StableDiffusion3Pipeline::TextEmbeddings out = all.front();
  if (all.size() == 1) return out;
  const auto join = [&](Tensor StableDiffusion3Pipeline::TextEmbeddings::*field) {
    std::vector<Tensor> parts;
    for (const auto& e : all) parts.push_back(e.*field);
    out.*field = concat(parts, 0);
  };
  for (auto field : {&StableDiffusion3Pipeline::TextEmbeddings::prompt_embeds,
                     &StableDiffusion3Pipeline::TextEmbeddings::pooled_prompt_embeds,
                     &StableDiffusion3Pipeline::TextEmbeddings::clip_l_hidden,
                     &StableDiffusion3Pipeline::TextEmbeddings::clip_l_pooled,
                     &StableDiffusion3Pipeline::TextEmbeddings::clip_g_hidden,
                     &StableDiffusion3Pipeline::TextEmbeddings::clip_g_pooled,
                     &StableDiffusion3Pipeline::TextEmbeddings::t5_hidden})
    join(field);
  return out;
}

}  // namespace

StableDiffusion3Pipeline::PromptEmbeddings StableDiffusion3Pipeline::encode_prompt(
    const PipelineRequest& call) const {
  const pipelines::ResolvedRequest r = pipelines::resolve(call, defaults());
  const int n = call.num_images_per_prompt;
  // Given embeddings (diffusers' prompt_embeds with pooled_prompt_embeds): each row n times.
  const auto given = [&](const Tensor& embeds, const Tensor& pooled) {
    TextEmbeddings e;
    e.prompt_embeds = pipelines::repeat_per_prompt(embeds.to(dtype_), n);
    e.pooled_prompt_embeds = pipelines::repeat_per_prompt(pooled.to(dtype_), n);
    return e;
  };
  PromptEmbeddings out;
  if (call.prompt_embeds.defined()) {
    out.positive = given(call.prompt_embeds, call.pooled_prompt_embeds);
  } else {
    std::vector<TextEmbeddings> positive;
    for (const std::string& prompt : pipelines::prompt_list(call))
      positive.push_back(encode_text(prompt, or_else(call.prompt_2, prompt), or_else(call.prompt_3, prompt),
                                     n, r.max_sequence_length));
    out.positive = concat_batch(std::move(positive));
  }
  if (r.guidance_scale <= 1.0f) return out;
  if (call.negative_prompt_embeds.defined()) {
    out.negative = given(call.negative_prompt_embeds, call.negative_pooled_prompt_embeds);
    return out;
  }
  // One negative prompt per prompt (or per given embedding row); "" when none is given.
  std::vector<TextEmbeddings> negative;
  for (int64_t i = 0; i < out.positive.prompt_embeds.size(0) / n; ++i) {
    const std::string text = pipelines::negative_prompt_of(call, static_cast<size_t>(i)).value_or("");
    negative.push_back(encode_text(text, or_else(call.negative_prompt_2, text),
                                   or_else(call.negative_prompt_3, text), n, r.max_sequence_length));
  }
  out.negative = concat_batch(std::move(negative));
  return out;
}

Tensor StableDiffusion3Pipeline::prepare_latents(int64_t batch, int64_t height, int64_t width, DType dtype,
                                                 Generator& generator) const {
  return prepare_latents(batch, height, width, dtype, std::vector<Generator*>{&generator});
}

Tensor StableDiffusion3Pipeline::prepare_latents(int64_t batch, int64_t height, int64_t width, DType dtype,
                                                 const std::vector<Generator*>& generators) const {
  const int64_t f = vae_->config().scale_factor();
  return randn_tensor({batch, transformer_->config().in_channels, height / f, width / f}, generators, dtype);
}

Tensor StableDiffusion3Pipeline::predict_velocity(const Tensor& latents, float timestep, int step,
                                                  const PromptEmbeddings& prompt,
                                                  const PipelineRequest& request) const {
  const pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  const SkipLayerGuidance& skip = request.skip_layer_guidance;
  const int64_t batch = latents.size(0);
  const TextEmbeddings& pos = prompt.positive;
  if (!prompt.negative) {
    return transformer_->forward(latents, pos.prompt_embeds, pos.pooled_prompt_embeds,
                                 Tensor::full({batch}, static_cast<double>(timestep), float32));
  }
  // Classifier-free guidance: [negative; positive] as one batch.
  const Tensor velocity = transformer_->forward(
      concat({latents, latents}, 0), concat({prompt.negative->prompt_embeds, pos.prompt_embeds}, 0),
      concat({prompt.negative->pooled_prompt_embeds, pos.pooled_prompt_embeds}, 0),
      Tensor::full({2 * batch}, static_cast<double>(timestep), float32));
  const Tensor uncond = velocity.narrow(0, 0, batch), text = velocity.narrow(0, batch, batch);
  Tensor guided = add(uncond, mul(static_cast<double>(call.guidance_scale), sub(text, uncond)));
  // Skip-layer guidance (diffusers compares the step index with steps * start / stop in Python floats).
  const double steps = call.num_inference_steps;
  if (!skip.layers.empty() && step > steps * skip.start && step < steps * skip.stop) {
    const Tensor skipped =
        transformer_->forward(latents, pos.prompt_embeds, pos.pooled_prompt_embeds,
                              Tensor::full({batch}, static_cast<double>(timestep), float32), skip.layers);
    guided = add(guided, mul(sub(text, skipped), skip.scale));
  }
  return guided;
}

Tensor StableDiffusion3Pipeline::decode_latents(const Tensor& latents) const {
  // diffusers: latents / scaling_factor + shift_factor, in the latents' dtype (the VAE runs in its load
  // dtype; this pipeline does not upcast it).
  const Tensor image = vae_->decode(vae_->from_latents(latents));
  return pipelines::postprocess(image);
}

PipelineDefaults StableDiffusion3Pipeline::family_defaults() const {
  return {.height = default_image_size(),
          .width = default_image_size(),
          .num_inference_steps = 28,
          .guidance_scale = 7.0f,
          .max_sequence_length = 256};
}

namespace {

// diffusers' image-to-image and inpainting defaults beside the text-to-image ones.
PipelineDefaults editing_defaults(PipelineDefaults d) {
  d.num_inference_steps = 50;
  d.strength = 0.6;
  return d;
}

}  // namespace

PipelineDefaults StableDiffusion3Img2ImgPipeline::family_defaults() const {
  return editing_defaults(StableDiffusion3Pipeline::family_defaults());
}
PipelineDefaults StableDiffusion3InpaintPipeline::family_defaults() const {
  return editing_defaults(StableDiffusion3Pipeline::family_defaults());
}

void StableDiffusion3Pipeline::check_loaded_request(const PipelineRequest& request) const {
  const char* kName = class_name();  // the errors name the class the caller has
  const pipelines::ResolvedRequest c = pipelines::resolve(request, defaults());
  const int64_t multiple = vae_->config().scale_factor() * transformer_->config().patch_size;
  pipelines::check_image_size(kName, c.height, c.width, multiple);
  const int64_t max_side = transformer_->config().pos_embed_max_size * multiple;
  if (c.height > max_side || c.width > max_side)
    throw RequestError(c.height > max_side ? "height" : "width",
                       std::string(kName) + ": " + std::to_string(c.height) + "x" + std::to_string(c.width) +
                           " is larger than this transformer's position table allows (" +
                           std::to_string(max_side) + " pixels per side)");
  const auto& tc = transformer_->config();
  // CLIP's 77 tokens, then T5's.
  const int64_t max_tokens = 77 + limits::kMaxSequenceLength;
  pipelines::check_given_embeddings(kName, request, tc.joint_attention_dim, max_tokens,
                                    tc.pooled_projection_dim);
  for (int64_t layer : request.skip_layer_guidance.layers)
    if (layer >= transformer_->config().num_layers)
      throw RequestError("skip_guidance_layers", std::string(kName) + ": skip_guidance_layers holds " +
                                                     std::to_string(layer) +
                                                     ", but the transformer has blocks 0.." +
                                                     std::to_string(transformer_->config().num_layers - 1));
  pipelines::check_task_inputs(registered_class().task, kName, request, c);
}

PipelineOutput StableDiffusion3Pipeline::run(const PipelineRequest& request,
                                             const pipelines::CallControl& control) {
  const pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  const PromptEmbeddings prompt = encode_prompt(request);
  release_after_use({{"text_encoder", text_encoder_.get()},
                     {"text_encoder_2", text_encoder_2_.get()},
                     {"text_encoder_3", text_encoder_3_.get()}});
  pipelines::CallGenerators generators(request);
  const int64_t batch = pipelines::batch_size(request);
  const DType dtype = prompt.positive.prompt_embeds.dtype();
  const int64_t f = vae_->config().scale_factor(), h = call.height / f, w = call.width / f;

  // The call's own schedule: the pipeline's scheduler is never changed by a call.
  FlowMatchEulerDiscreteScheduler schedule = *scheduler_;
  std::optional<double> mu;
  if (schedule.config().use_dynamic_shifting) {
    const int64_t p = transformer_->config().patch_size;
    mu = calculate_shift(schedule.config(), (h / p) * (w / p), 1.16);
  }
  schedule.set_timesteps(call.num_inference_steps, std::nullopt, mu);

  // prepare: where the task starts (pipelines/task_stages.h); the transformer takes the latents as they are.
  const pipelines::TaskCall task{.task = registered_class().task,
                                 .pipeline = class_name(),
                                 .request = request,
                                 .call = call,
                                 .batch = batch,
                                 .dtype = dtype,
                                 .generators = generators,
                                 .schedule = schedule,
                                 .codec = *vae_,
                                 .noise_at_full_strength = true};
  const pipelines::TaskStart start = pipelines::start_latents(task);
  const int first = start.start_step;
  std::map<std::string, std::string> extra;
  if (!request.skip_layer_guidance.layers.empty()) {
    std::string layers;
    for (int64_t l : request.skip_layer_guidance.layers)
      layers += (layers.empty() ? "" : ",") + std::to_string(l);
    extra["skip_guidance_layers"] = layers;
  }
  return denoise_and_decode(
      task, start,
      [&](const Tensor& x, int step, float timestep) {
        return predict_velocity(x, timestep, step - first, prompt, request);
      },
      [&](const Tensor& latents) { return decode_call(latents); }, call.guidance_scale > 1.0f,
      std::move(extra), control);
}

Tensor StableDiffusion3Pipeline::decode_call(const Tensor& latents) const {
  return decode_latents(latents);
}

Tensor StableDiffusion3InpaintPipeline::decode_call(const Tensor& latents) const {
  return pipelines::postprocess(vae().decode(div(latents, vae().config().scaling_factor)));
}

std::vector<std::pair<std::string, nn::Module*>> StableDiffusion3Pipeline::components() const {
  return {{"text_encoder", text_encoder_.get()},
          {"text_encoder_2", text_encoder_2_.get()},
          {"text_encoder_3", text_encoder_3_.get()},
          {"transformer", transformer_.get()},
          {"vae", vae_.get()}};
}

models::LatentCodec& StableDiffusion3Pipeline::latent_codec() const {
  return *vae_;
}

nn::Module& StableDiffusion3Pipeline::denoiser() {
  return *transformer_;
}

ActivationEstimate StableDiffusion3Pipeline::estimate_activations(const PipelineRequest& request,
                                                                  const Device& device) const {
  const pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  const models::SD3TransformerConfig& tc = transformer_->config();
  const int64_t f = vae_->config().scale_factor() * tc.patch_size;  // pixels per token
  const int64_t clip_tokens = text_encoder_->config().max_position_embeddings;
  ActivationEstimate e{.height = call.height, .width = call.width};
  e.text_encoders = std::max(pipelines::clip_activation_bytes(text_encoder_->config(), dtype(), device),
                             pipelines::clip_activation_bytes(text_encoder_2_->config(), dtype(), device));
  if (text_encoder_3_)
    e.text_encoders = std::max(
        e.text_encoders,
        pipelines::t5_activation_bytes(text_encoder_3_->config(), call.max_sequence_length, dtype()));
  // Classifier-free guidance runs the prompt and the negative prompt as one batch.
  const int64_t batch = pipelines::batch_size(request) * (call.guidance_scale > 1.0f ? 2 : 1);
  e.transformer = pipelines::dit_step_activation_bytes(
      batch, (call.height / f) * (call.width / f) + clip_tokens + call.max_sequence_length,
      tc.num_attention_heads, tc.attention_head_dim, dtype(), device);
  e.vae =
      vae_activation_bytes(*vae_, pipelines::batch_size(request), call.height, call.width, dtype(), device);
  return e;
}

}  // namespace kiln
