#include "kiln/families/flux2/flux2_pipeline.h"

#include <cmath>
#include <tuple>

#include "families/flux2/flux2_reference_image.h"
#include "kiln/core/limits.h"
#include "kiln/core/log.h"
#include "kiln/models/autoencoder_kl_flux2.h"
#include "kiln/models/flux2_prompt_encoder.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/ops.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/schedulers/flow_match_euler.h"
#include "kiln/schedulers/timestep_shift.h"
#include "pipelines/call_control.h"
#include "pipelines/call_generators.h"
#include "pipelines/denoise.h"
#include "pipelines/pipeline_common.h"
#include "pipelines/task_stages.h"

namespace kiln {

namespace {

// Flux2Pipeline.default_sample_size: 128 latents of the VAE's scale factor 8, 1024 pixels.
constexpr int64_t kDefaultSampleSize = 128;

}  // namespace

Flux2PipelineBase::Flux2PipelineBase(Variant variant) : variant_(variant) {}
Flux2PipelineBase::Flux2PipelineBase(Flux2PipelineBase&&) noexcept = default;
Flux2PipelineBase& Flux2PipelineBase::operator=(Flux2PipelineBase&&) noexcept = default;
Flux2PipelineBase::~Flux2PipelineBase() = default;

void Flux2PipelineBase::load(const std::string& model, const PipelineLoadOptions& options,
                             const char* pipeline_class) {
  pipelines::PipelineFolder folder(model, options, pipeline_class);
  KILN_CHECK(
      options.transformer_file.empty(),
      pipeline_class << ": single-file transformers are FLUX.1 and SD3 only; load the FLUX.2 transformer "
                        "from the model's transformer/ folder");
  path_ = folder.path();
  name_ = model;
  dtype_ = options.dtype;
  make_context(options, model);
  ExecutionScope loading_in(*context_);
  const bool dev = variant_ == Variant::Dev;
  // Both listed (real folders) or both [null, null] (folders saved without them, driven by prompt_embeds).
  const bool text = folder.present("text_encoder") || folder.present("tokenizer");
  folder.set_component_count(text ? 5 : 3);
  scheduler_ =
      std::make_unique<FlowMatchEulerDiscreteScheduler>(FlowMatchEulerDiscreteScheduler::from_pretrained(
          folder.need("scheduler", {"FlowMatchEulerDiscreteScheduler"})));
  folder.loaded("scheduler");
  const std::vector<std::string>& splittable = find_pipeline_class(pipeline_class)->splittable_components;
  if (text) {
    // The slow and fast tokenizer classes read the same tokenizer.json.
    const std::string tokenizer = dev ? folder.need("tokenizer", {"PixtralProcessor"})
                                      : folder.need("tokenizer", {"Qwen2TokenizerFast", "Qwen2Tokenizer"});
    const std::string text_encoder =
        folder.need("text_encoder", {dev ? "Mistral3ForConditionalGeneration" : "Qwen3ForCausalLM"});
    const auto family = models::DecoderTextEncoderConfig::from_file(text_encoder + "/config.json").family;
    const auto expected = dev ? models::DecoderFamily::Mistral : models::DecoderFamily::Qwen3;
    KILN_CHECK(family == expected, text_encoder << "/config.json: " << pipeline_class << " expects a "
                                                << (dev ? "Mistral 3" : "Qwen3") << " text encoder");
    text_side_ = std::make_unique<Flux2PromptEncoder>(Flux2PromptEncoder::from_folders(
        text_encoder, tokenizer,
        {.dtype = options.dtype, .tp = options.tensor_parallel_for("text_encoder", splittable)},
        [&](const char* component) { folder.loaded(component); }));
  }
  transformer_ =
      models::load_flux2_transformer(folder.need("transformer", {"Flux2Transformer2DModel"}), options.dtype,
                                     options.tensor_parallel_for("transformer", splittable));
  folder.loaded("transformer");
  vae_ = models::load_autoencoder_kl_flux2(folder.need("vae", {"AutoencoderKLFlux2"}), options.dtype);
  folder.loaded("vae");
  if (variant_ == Variant::Klein) is_distilled_ = folder.index().raw.get_or<bool>("is_distilled", false);
  finish_loading(options.packed_weight_budget);
  KILN_CHECK(transformer_->config().in_channels == vae_->patchified_channels(),
             path_ << ": transformer in_channels " << transformer_->config().in_channels
                   << " is not 4 x the VAE's latent_channels " << vae_->config().latent_channels);
  KILN_CHECK(!text_side_ || text_side_->embedding_dim() == transformer_->config().joint_attention_dim,
             path_ << ": the text encoder's " << text_side_->text_encoder_out_layers().size()
                   << " hidden states of " << text_side_->text_encoder().config().hidden_size << " make "
                   << text_side_->embedding_dim() << " values per token, but the transformer's "
                   << "joint_attention_dim is " << transformer_->config().joint_attention_dim);
  KILN_CHECK(transformer_->config().out_channels == transformer_->config().in_channels,
             path_ << ": transformer out_channels " << transformer_->config().out_channels
                   << " differs from in_channels " << transformer_->config().in_channels
                   << " (the scheduler steps the latents with the prediction)");
}

Flux2Pipeline Flux2Pipeline::from_pretrained(const std::string& model, const PipelineLoadOptions& options) {
  Flux2Pipeline pipe;
  pipe.load(model, options, "Flux2Pipeline");
  return pipe;
}

Flux2KleinPipeline Flux2KleinPipeline::from_pretrained(const std::string& model,
                                                       const PipelineLoadOptions& options) {
  Flux2KleinPipeline pipe;
  pipe.load(model, options, "Flux2KleinPipeline");
  return pipe;
}

std::pair<Tensor, Tensor> Flux2PipelineBase::encode_prompt(const std::string& prompt,
                                                           const Tensor& prompt_embeds,
                                                           int num_images_per_prompt,
                                                           int64_t max_sequence_length) const {
  return encode_prompts({prompt}, prompt_embeds, num_images_per_prompt, max_sequence_length);
}

std::pair<Tensor, Tensor> Flux2PipelineBase::encode_prompts(const std::vector<std::string>& prompts,
                                                            const Tensor& prompt_embeds,
                                                            int num_images_per_prompt,
                                                            int64_t max_sequence_length) const {
  Tensor embeds = prompt_embeds;
  if (!embeds.defined()) {
    if (custom_prompt_encoder_) {
      embeds = custom_prompt_encoder_(prompts, max_sequence_length);
    } else {
      KILN_CHECK(text_side_, name() << ": " << path_
                                    << " has no text encoder (model_index.json lists text_encoder and "
                                       "tokenizer as null); pass prompt_embeds (and, for classifier-free "
                                       "guidance, negative_prompt_embeds) or install a prompt encoder");
      embeds = text_side_->encode(prompts, max_sequence_length).prompt_embeds;
    }
  }
  const int64_t joint = transformer_->config().joint_attention_dim;
  KILN_CHECK(embeds.dim() == 3 && embeds.size(0) >= 1 && embeds.size(1) >= 1 && embeds.size(2) == joint &&
                 embeds.dtype() == dtype_,
             name() << ": expected prompt embeddings [B, L, " << joint << "] " << dtype_name(dtype_)
                    << " (the transformer's joint_attention_dim, the pipeline's dtype), got "
                    << embeds.str());
  embeds = pipelines::repeat_per_prompt(embeds, num_images_per_prompt);
  return {embeds, models::flux2_text_ids(embeds.size(1))};
}

std::pair<Tensor, Tensor> Flux2PipelineBase::prepare_latents(int64_t batch, int64_t height, int64_t width,
                                                             DType dtype, Generator& generator) const {
  return prepare_latents(batch, height, width, dtype, std::vector<Generator*>{&generator});
}

std::pair<Tensor, Tensor> Flux2PipelineBase::prepare_latents(
    int64_t batch, int64_t height, int64_t width, DType dtype,
    const std::vector<Generator*>& generators) const {
  // Drawn in the patchified shape, so the stream lands on the channels as in diffusers.
  const Shape shape = vae_->latent_shape(batch, height, width);
  return {tokens(randn_tensor(shape, generators, dtype)), models::flux2_latent_ids(shape[2], shape[3])};
}

Tensor Flux2PipelineBase::tokens(const Tensor& latents) {
  // _pack_latents: [B, C, h, w] -> [B, C, h * w] -> [B, h * w, C]
  const int64_t b = latents.size(0), c = latents.size(1), hw = latents.size(2) * latents.size(3);
  return latents.reshape({b, c, hw}).transpose(1, 2).contiguous();
}

Tensor Flux2PipelineBase::preprocess_image(const Image& image) const {
  return pipelines::preprocess_flux2_reference(image, vae_->config().scale_factor() * 2);
}

std::pair<Tensor, Tensor> Flux2PipelineBase::prepare_image_latents(const std::vector<Tensor>& images,
                                                                   int64_t batch) const {
  std::vector<Tensor> tokens;
  std::vector<std::pair<int64_t, int64_t>> grids;
  for (const Tensor& image : images) {
    // _encode_vae_image: the latent distribution's mode (its mean), patchified, normalised.
    const Tensor z = pipelines::encode_image(*vae_, image, dtype_, nullptr);
    grids.emplace_back(z.size(2), z.size(3));
    tokens.push_back(z.reshape({z.size(1), z.size(2) * z.size(3)}).transpose(0, 1));
  }
  const Tensor all = concat(tokens, 0).unsqueeze(0);
  return {all.expand({batch, all.size(1), all.size(2)}).contiguous(), models::flux2_image_ids(grids)};
}

Tensor Flux2PipelineBase::decode_latents(const Tensor& latents, int64_t height, int64_t width) const {
  const int64_t f = vae_->config().scale_factor() * 2;
  const int64_t b = latents.size(0), c = latents.size(2), h = height / f, w = width / f;
  KILN_CHECK(latents.dim() == 3 && latents.size(1) == h * w,
             name() << ".decode_latents: expected [B, " << h * w << ", C] latents for " << height << "x"
                    << width << ", got " << shape_str(latents.shape()));
  // _unpack_latents_with_ids: the ids are row-major, so scattering them back is the transpose of packing.
  const Tensor grid = latents.transpose(1, 2).reshape({b, c, h, w});
  const Tensor z = models::AutoencoderKLFlux2::unpatchify(vae_->denormalize(grid));
  return pipelines::postprocess(vae_->decode(z));
}

bool Flux2PipelineBase::classifier_free_guidance(float guidance_scale) const {
  return variant_ == Variant::Klein && guidance_scale > 1.0f && !is_distilled_;
}

PipelineDefaults Flux2PipelineBase::family_defaults() const {
  const int64_t size = kDefaultSampleSize * vae_->config().scale_factor();
  return {.height = size,
          .width = size,
          .num_inference_steps = 50,
          .guidance_scale = 4.0f,
          .max_sequence_length = 512};
}

pipelines::ResolvedRequest Flux2PipelineBase::resolved(const PipelineRequest& request,
                                                       const std::vector<Tensor>& references) const {
  PipelineDefaults d = defaults();
  // diffusers: height = height or the first reference image's, else the default.
  if (!references.empty()) {
    d.height = references.front().size(2);
    d.width = references.front().size(3);
  }
  const pipelines::ResolvedRequest c = pipelines::resolve(request, d);
  pipelines::check_image_size(name(), c.height, c.width, vae_->config().scale_factor() * 2);
  return c;
}

bool Flux2PipelineBase::negative_evaluations(const PipelineRequest& request) const {
  return classifier_free_guidance(pipelines::resolve(request, defaults()).guidance_scale);
}

void Flux2PipelineBase::check_loaded_request(const PipelineRequest& request) const {
  // A size given explicitly is checked against its limit here already; one taken from a reference image is
  // checked by resolved().
  const pipelines::ResolvedRequest c = pipelines::resolve(request, defaults());
  if (request.height || request.width) pipelines::check_image_size(name(), c.height, c.width, 1);
  pipelines::refuse(
      !request.prompt_embeds.defined() && !has_prompt_encoder(), "prompt",
      std::string(name()) + ": this " + name() +
          " has no text encoder (text_encoder is null in model_index.json) to encode the prompt; "
          "give prompt_embeds or set_prompt_encoder()");
}

PipelineOutput Flux2PipelineBase::run(const PipelineRequest& request, const pipelines::CallControl& control) {
  std::vector<Tensor> references;
  for (const Image& image : request.image) references.push_back(preprocess_image(image));
  const pipelines::ResolvedRequest call = resolved(request, references);
  const int n = request.num_images_per_prompt;
  const std::string negative_prompt = request.negative_prompt.value_or("");
  const std::vector<std::string> prompts = pipelines::prompt_list(request);
  // Named tensors, not structured bindings: the step lambda captures them (clang 14 cannot capture bindings).
  Tensor embeds, text_ids;
  std::tie(embeds, text_ids) = encode_prompts(prompts, request.prompt_embeds, n, call.max_sequence_length);
  const bool cfg = classifier_free_guidance(call.guidance_scale);
  if (variant_ == Variant::Klein && is_distilled_ && call.guidance_scale > 1.0f)
    warn(std::string(name()) + ": guidance scale " + std::to_string(call.guidance_scale) +
         " is ignored for step-wise distilled models");
  Tensor negative, negative_ids;
  if (cfg) {
    // One negative prompt per prompt (diffusers' klein: "" for each prompt of a list).
    std::vector<std::string> negatives;
    for (size_t i = 0; i < prompts.size(); ++i)
      negatives.push_back(pipelines::negative_prompt_of(request, i).value_or(""));
    std::tie(negative, negative_ids) =
        encode_prompts(negatives, request.negative_prompt_embeds, n, call.max_sequence_length);
    KILN_CHECK(negative.size(0) == embeds.size(0), name() << ": negative_prompt_embeds has batch "
                                                          << negative.size(0) / n << ", prompt_embeds "
                                                          << embeds.size(0) / n);
  }
  // Model offload: the text encoder's memory goes to the transformer.
  if (text_side_) release_after_use({{"text_encoder", &text_side_->text_encoder()}});

  pipelines::CallGenerators generators(request);
  const int64_t batch = embeds.size(0);
  const int64_t f = vae_->pixels_per_latent();
  const int64_t h = call.height / f, w = call.width / f;
  const Tensor latent_ids = models::flux2_latent_ids(h, w);
  const int64_t image_tokens = h * w;
  Tensor image_latents, ids = latent_ids;
  if (!references.empty()) {
    Tensor image_ids;
    std::tie(image_latents, image_ids) = prepare_image_latents(references, batch);
    ids = concat({latent_ids, image_ids}, 0);
    // Model offload: the VAE's memory goes to the transformer until the decode needs it again.
    release_after_use({{"vae", vae_.get()}});
  }

  // The call's own schedule: the pipeline's scheduler is never changed by a call.
  FlowMatchEulerDiscreteScheduler schedule = *scheduler_;
  schedule.set_timesteps(call.num_inference_steps, flux_sigmas(call.num_inference_steps),
                         compute_empirical_mu(image_tokens, call.num_inference_steps));
  // prepare: the noise (pipelines/task_stages.h), drawn in the patchified shape so the stream lands on the
  // channels as in diffusers, as tokens.
  const pipelines::TaskCall task{.task = registered_class().task,
                                 .pipeline = class_name(),
                                 .request = request,
                                 .call = call,
                                 .batch = batch,
                                 .dtype = embeds.dtype(),
                                 .generators = generators,
                                 .schedule = schedule,
                                 .codec = *vae_,
                                 .pack = tokens};
  const pipelines::TaskStart start = pipelines::start_latents(task);
  // Flux2Pipeline passes the guidance scale (float32) to every call; Flux2KleinPipeline passes none.
  const Tensor guidance = variant_ == Variant::Dev
                              ? Tensor::full({batch}, static_cast<double>(call.guidance_scale), float32)
                              : Tensor();
  const double scale = call.guidance_scale;
  std::map<std::string, std::string> extra;
  if (!references.empty()) extra["reference_images"] = std::to_string(references.size());
  return denoise_and_decode(
      task, start,
      [&](const Tensor& x, int, float timestep) {
        // diffusers: t.expand(B).to(latents.dtype) / 1000; the reference latents follow the noise.
        const Tensor t = div(Tensor::full({batch}, timestep, float32).to(x.dtype()), 1000.0);
        const Tensor input = image_latents.defined() ? concat({x, image_latents.to(x.device())}, 1) : x;
        // The step cache's contexts, as Flux2KleinPipeline enters them (Flux2Pipeline enters none, which
        // diffusers' MagCache runs as one context and its TaylorSeer refuses; here it is "cond", as
        // FLUX.1's).
        cache_context("cond");
        Tensor v =
            transformer_->forward(input, embeds, t, guidance, text_ids, ids).narrow(1, 0, image_tokens);
        if (!cfg) return v;
        cache_context("uncond");
        const Tensor uncond =
            transformer_->forward(input, negative, t, Tensor(), negative_ids, ids).narrow(1, 0, image_tokens);
        cache_context("cond");
        return add(uncond, mul(sub(v, uncond), scale));
      },
      [&](const Tensor& latents) { return decode_latents(latents, call.height, call.width); }, cfg,
      std::move(extra), control);
}

std::vector<std::pair<std::string, nn::Module*>> Flux2PipelineBase::components() const {
  nn::Module* text_encoder = text_side_ ? &text_side_->text_encoder() : nullptr;
  return {{"text_encoder", text_encoder}, {"transformer", transformer_.get()}, {"vae", vae_.get()}};
}

models::LatentCodec& Flux2PipelineBase::latent_codec() const {
  return *vae_;
}

nn::Module& Flux2PipelineBase::denoiser() {
  return *transformer_;
}

ActivationEstimate Flux2PipelineBase::estimate_activations(const PipelineRequest& request,
                                                           const Device& device) const {
  std::vector<Tensor> references;
  for (const Image& image : request.image) references.push_back(preprocess_image(image));
  const pipelines::ResolvedRequest call = resolved(request, references);
  const models::Flux2TransformerConfig& tc = transformer_->config();
  const int64_t f = vae_->config().scale_factor() * 2;  // pixels per token: the latents are patchified 2x2
  int64_t tokens = (call.height / f) * (call.width / f) + call.max_sequence_length;
  for (const Tensor& r : references) tokens += (r.size(2) / f) * (r.size(3) / f);
  ActivationEstimate e{.height = call.height, .width = call.width};
  if (text_side_) {
    const models::DecoderTextEncoderConfig& ec = text_side_->text_encoder().config();
    // The padded prompt under a causal mask (no fused attention), and the layers it keeps stacked.
    e.text_encoders =
        block_stack_activation_bytes({.tokens = call.max_sequence_length,
                                      .width = std::max(ec.hidden_size, ec.num_attention_heads * ec.head_dim),
                                      .mlp_width = ec.intermediate_size,
                                      .heads = ec.num_attention_heads,
                                      .fused_attention = false},
                                     dtype()) +
        static_cast<int64_t>(text_side_->text_encoder_out_layers().size()) * call.max_sequence_length *
            ec.hidden_size * static_cast<int64_t>(dtype_size(dtype()));
  }
  // Classifier-free guidance runs the negative prompt as a second forward, not a larger batch.
  e.transformer = block_stack_activation_bytes(
      {.batch = pipelines::batch_size(request),
       .tokens = tokens,
       .width = tc.inner_dim(),
       .mlp_width = tc.mlp_hidden_dim(),
       .heads = tc.num_attention_heads,
       .fused_attention = fuses_attention(device, dtype(), tc.attention_head_dim),
       .attention_key_block = attention_key_block(device, dtype(), tc.attention_head_dim)},
      dtype());
  e.vae =
      vae_activation_bytes(*vae_, pipelines::batch_size(request), call.height, call.width, dtype(), device);
  return e;
}

}  // namespace kiln
