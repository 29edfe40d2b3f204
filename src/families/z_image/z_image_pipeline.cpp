#include "kiln/families/z_image/z_image_pipeline.h"

#include <algorithm>
#include <cmath>

#include "families/family_helpers.h"
#include "kiln/core/log.h"
#include "kiln/families/z_image/z_image_transformer.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/ops.h"
#include "kiln/pipelines/activation_estimate.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/schedulers/flow_match_euler.h"
#include "kiln/tokenizers/bpe_tokenizer.h"
#include "kiln/tokenizers/chat_prompts.h"
#include "pipelines/call_control.h"
#include "pipelines/call_generators.h"
#include "pipelines/pipeline_common.h"
#include "pipelines/task_stages.h"

namespace kiln {

namespace {

// get_default_z_image_sigmas: torch.linspace(1.0, 1 / n, n) in float32, as torch's CPU kernel computes it
// (from the start for the first half, from the end for the second).
std::vector<double> z_image_sigmas(int n) {
  const float start = 1.0f, end = static_cast<float>(1.0 / n);
  const float step = n > 1 ? (end - start) / static_cast<float>(n - 1) : 0.0f;
  std::vector<double> out;
  for (int i = 0; i < n; ++i)
    out.push_back(i < n / 2 ? start + step * static_cast<float>(i)
                            : end - step * static_cast<float>(n - i - 1));
  return out;
}

}  // namespace

ZImagePipeline::ZImagePipeline() = default;
ZImagePipeline::ZImagePipeline(ZImagePipeline&&) noexcept = default;
ZImagePipeline& ZImagePipeline::operator=(ZImagePipeline&&) noexcept = default;
ZImagePipeline::~ZImagePipeline() = default;
ZImagePipeline::ZImagePipeline(const ZImagePipeline& pipe, SharingComponents)
    : DiffusionPipeline(pipe, SharingComponents{}),
      tokenizer_(pipe.tokenizer_),
      text_encoder_(pipe.text_encoder_),
      transformer_(pipe.transformer_),
      vae_(pipe.vae_),
      scheduler_(pipe.scheduler_) {}

ZImagePipeline ZImagePipeline::from_pipe(const ZImagePipeline& pipe) {
  return ZImagePipeline(pipe, SharingComponents{});
}
ZImageImg2ImgPipeline ZImageImg2ImgPipeline::from_pipe(const ZImagePipeline& pipe) {
  return ZImageImg2ImgPipeline(pipe, SharingComponents{});
}
ZImageInpaintPipeline ZImageInpaintPipeline::from_pipe(const ZImagePipeline& pipe) {
  return ZImageInpaintPipeline(pipe, SharingComponents{});
}

ZImagePipeline ZImagePipeline::from_pretrained(const std::string& model, const PipelineLoadOptions& options) {
  ZImagePipeline pipe;
  load(pipe, model, options, "ZImagePipeline");
  return pipe;
}

ZImageImg2ImgPipeline ZImageImg2ImgPipeline::from_pretrained(const std::string& model,
                                                             const PipelineLoadOptions& options) {
  ZImageImg2ImgPipeline pipe;
  load(pipe, model, options, "ZImageImg2ImgPipeline");
  return pipe;
}

ZImageInpaintPipeline ZImageInpaintPipeline::from_pretrained(const std::string& model,
                                                             const PipelineLoadOptions& options) {
  ZImageInpaintPipeline pipe;
  load(pipe, model, options, "ZImageInpaintPipeline");
  return pipe;
}

PipelineDefaults ZImagePipeline::family_defaults() const {
  return {.num_inference_steps = 50, .guidance_scale = 5.0f, .max_sequence_length = 512};
}

PipelineDefaults ZImageImg2ImgPipeline::family_defaults() const {
  return {.num_inference_steps = 50, .guidance_scale = 5.0f, .max_sequence_length = 512, .strength = 0.6};
}

PipelineDefaults ZImageInpaintPipeline::family_defaults() const {
  return {.num_inference_steps = 50, .guidance_scale = 5.0f, .max_sequence_length = 512, .strength = 1.0};
}

void ZImagePipeline::load(ZImagePipeline& pipe, const std::string& model, const PipelineLoadOptions& options,
                          const char* pipeline_class) {
  pipelines::PipelineFolder folder(model, options, pipeline_class,
                                   {"ZImagePipeline", "ZImageImg2ImgPipeline", "ZImageInpaintPipeline"});
  folder.set_component_count(5);
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
  const std::string tokenizer = folder.need("tokenizer", {"Qwen2Tokenizer", "Qwen2TokenizerFast"});
  pipe.tokenizer_ =
      std::make_unique<tokenizers::BpeTokenizer>(tokenizers::BpeTokenizer::from_directory(tokenizer));
  KILN_CHECK(pipe.tokenizer_->pad_id().has_value(),
             tokenizer << ": no pad token (Z-Image pads to max_length)");
  done("tokenizer");
  const std::vector<std::string>& splittable = find_pipeline_class(pipeline_class)->splittable_components;
  // hidden_states[-2]: the output of the last layer but one, with no final norm.
  const std::string text_encoder = folder.need("text_encoder", {"Qwen3Model", "Qwen3ForCausalLM"});
  const auto text_config = models::DecoderTextEncoderConfig::from_file(text_encoder + "/config.json");
  KILN_CHECK(
      text_config.family == models::DecoderFamily::Qwen3 && text_config.num_hidden_layers >= 2,
      text_encoder << ": Z-Image reads a Qwen3 text encoder's second-to-last hidden states; expected a Qwen3 "
                      "config with at least 2 layers");
  pipe.text_encoder_ =
      models::load_decoder_text_encoder(text_encoder, options.dtype, {text_config.num_hidden_layers - 1},
                                        options.tensor_parallel_for("text_encoder", splittable));
  done("text_encoder");
  if (options.transformer_file.empty()) {
    pipe.transformer_ = models::load_z_image_transformer(
        folder.need("transformer", {"ZImageTransformer2DModel"}), options.dtype,
        options.tensor_parallel_for("transformer", splittable));
  } else {
    // As ComfyUI ships it (or a GGUF of it), with the folder's config when it has one.
    pipe.transformer_ = models::ZImageTransformer2DModel::from_single_file(
        options.transformer_file,
        {.config = single_file_transformer_config(folder.path(), options, pipeline_class),
         .dtype = options.dtype});
  }
  done("transformer");
  pipe.vae_ = models::load_autoencoder_kl(folder.need("vae", {"AutoencoderKL"}), options.dtype);
  done("vae");
  pipe.finish_loading(options.packed_weight_budget);
  const auto& tc = pipe.transformer_->config();
  KILN_CHECK(tc.cap_feat_dim == text_config.hidden_size,
             pipe.path_ << ": transformer cap_feat_dim " << tc.cap_feat_dim << " does not match text_encoder "
                        << "hidden_size " << text_config.hidden_size);
  KILN_CHECK(tc.in_channels == pipe.vae_->config().latent_channels,
             pipe.path_ << ": transformer in_channels " << tc.in_channels
                        << " does not match the vae's latent_channels "
                        << pipe.vae_->config().latent_channels);
}

std::string ZImagePipeline::chat_prompt(const std::string& prompt) {
  return tokenizers::qwen3_chat_prompt(prompt, /*enable_thinking=*/true);
}

std::pair<Tensor, Tensor> ZImagePipeline::tokenize(const std::vector<std::string>& prompts,
                                                   int64_t max_sequence_length) const {
  std::vector<int64_t> ids, mask;
  for (const std::string& prompt : prompts) {
    tokenizers::BpeEncodeOptions options;
    options.max_length = max_sequence_length;
    const tokenizers::Encoding e = tokenizer_->encode(chat_prompt(prompt), options);
    ids.insert(ids.end(), e.ids.begin(), e.ids.end());
    mask.insert(mask.end(), e.attention_mask.begin(), e.attention_mask.end());
  }
  const auto batch = static_cast<int64_t>(prompts.size());
  return {Tensor::from_vector(ids, {batch, max_sequence_length}),
          Tensor::from_vector(mask, {batch, max_sequence_length})};
}

std::vector<Tensor> ZImagePipeline::encode_prompt(const std::vector<std::string>& prompts,
                                                  int64_t max_sequence_length) const {
  std::vector<Tensor> out;
  const int64_t layer = text_encoder_->config().num_hidden_layers - 1;
  for (const std::string& prompt : prompts) {
    const std::string text = chat_prompt(prompt);
    if (static_cast<int64_t>(tokenizer_->tokenize(text).size()) > max_sequence_length)
      warn("the prompt is longer than max_sequence_length (" + std::to_string(max_sequence_length) +
           " tokens with the chat template) and was truncated");
    tokenizers::BpeEncodeOptions options;
    options.max_length = max_sequence_length;
    options.pad_to_max_length = false;
    const tokenizers::Encoding e = tokenizer_->encode(text, options);
    // Padding sits on the right and the attention is causal: the prompt's tokens alone give the same states.
    const auto length = static_cast<int64_t>(e.ids.size());
    const Tensor ids = Tensor::from_vector(e.ids, {1, length});
    const Tensor mask = Tensor::full({1, length}, 1.0, int64);
    out.push_back(text_encoder_->hidden_states(ids, mask, {layer})[0].select(0, 0));
  }
  return out;
}

void ZImagePipeline::check_loaded_request(const PipelineRequest& request) const {
  const char* name = class_name();
  const int64_t multiple = vae_->config().scale_factor() * 2;
  const pipelines::ResolvedRequest r =
      pipelines::resolve_with_image_size(request, defaults(), registered_class().edits_an_image(), multiple);
  pipelines::check_image_size(name, r.height, r.width, multiple);
  pipelines::check_task_inputs(registered_class().task, name, request, r);
}

PipelineOutput ZImagePipeline::run(const PipelineRequest& request, const pipelines::CallControl& control) {
  const int64_t multiple = vae_->config().scale_factor() * 2;
  const pipelines::ResolvedRequest call =
      pipelines::resolve_with_image_size(request, defaults(), registered_class().edits_an_image(), multiple);
  const int n = request.num_images_per_prompt;
  const std::vector<std::string> prompts = pipelines::prompt_list(request);
  // encode: classifier-free guidance whenever guidance_scale > 0 (diffusers' do_classifier_free_guidance),
  // with one negative prompt per prompt ("" when none is given).
  const bool guided = call.guidance_scale > 0.0f;
  if (!guided && pipelines::has_negative_prompt(request))
    warn(std::string(class_name()) +
         ": negative_prompt is ignored when guidance_scale is 0, as in diffusers");
  std::vector<Tensor> captions;
  for (const Tensor& c : encode_prompt(prompts, call.max_sequence_length))
    for (int k = 0; k < n; ++k) captions.push_back(c);
  std::vector<Tensor> negative_captions;
  if (guided) {
    std::vector<std::string> negatives;
    for (size_t i = 0; i < prompts.size(); ++i)
      negatives.push_back(pipelines::negative_prompt_of(request, i).value_or(""));
    for (const Tensor& c : encode_prompt(negatives, call.max_sequence_length))
      for (int k = 0; k < n; ++k) negative_captions.push_back(c);
  }
  release_after_use({{"text_encoder", text_encoder_.get()}});

  pipelines::CallGenerators generators(request);
  const int64_t batch = pipelines::batch_size(request);
  const DType dtype = captions.front().dtype();
  const int64_t f = vae_->config().scale_factor();
  const int64_t h = 2 * (call.height / (f * 2)), w = 2 * (call.width / (f * 2));

  // The call's own schedule: Z-Image's sigmas, shifted as the scheduler's config says (Z-Image-Turbo: a
  // static shift of 3; with dynamic shifting, by the image's token count).
  FlowMatchEulerDiscreteScheduler schedule = *scheduler_;
  schedule.set_timesteps(call.num_inference_steps, z_image_sigmas(call.num_inference_steps),
                         calculate_shift(schedule.config(), (h / 2) * (w / 2)));

  // Text-to-image keeps its latents in float32; the editing classes start from latents in the prompt's dtype
  // (the first Euler step returns them in float32).
  const bool edits = registered_class().edits_an_image();
  const pipelines::TaskCall task{.task = registered_class().task,
                                 .pipeline = class_name(),
                                 .request = request,
                                 .call = call,
                                 .batch = batch,
                                 .dtype = edits ? dtype : float32,
                                 .generators = generators,
                                 .schedule = schedule,
                                 .codec = *vae_};
  const pipelines::TaskStart start = pipelines::start_latents(task);
  const float guidance_scale = call.guidance_scale;
  const float truncation = request.cfg_truncation.value_or(1.0f);
  const float normalization = request.cfg_normalization.value_or(0.0f);

  // denoise, decode
  return denoise_and_decode(
      task, start,
      [&](const Tensor& latents, int, float t) {
        // The model's time runs the other way: (1000 - t) / 1000.
        const float time = (1000.0f - t) / 1000.0f;
        const Tensor x = latents.to(dtype);
        // cfg_truncation: no guidance past it (only checked when it is at most 1, as diffusers).
        const bool apply_cfg = guided && !(truncation <= 1.0f && time > truncation);
        Tensor positive, negative;
        if (apply_cfg) {
          std::vector<Tensor> both = captions;
          both.insert(both.end(), negative_captions.begin(), negative_captions.end());
          const Tensor out =
              transformer_->forward(concat({x, x}, 0), Tensor::full({2 * batch}, time, float32), both)
                  .to(float32);
          positive = out.narrow(0, 0, batch);
          negative = out.narrow(0, batch, batch);
        } else {
          positive = transformer_->forward(x, Tensor::full({batch}, time, float32), captions).to(float32);
        }
        Tensor prediction = positive;
        if (apply_cfg) {
          // pos + g * (pos - neg), then (cfg_normalization) each image's norm capped at that many times
          // pos's.
          prediction = add(positive, mul(static_cast<double>(guidance_scale), sub(positive, negative)));
          if (normalization > 0.0f) {
            std::vector<Tensor> images;
            for (int64_t b = 0; b < batch; ++b) {
              const Tensor pos = positive.narrow(0, b, 1), pred = prediction.narrow(0, b, 1);
              const double pos_norm = std::sqrt(sum(square(pos)).item());
              const double pred_norm = std::sqrt(sum(square(pred)).item());
              const double cap = pos_norm * static_cast<double>(normalization);
              images.push_back(pred_norm > cap ? mul(pred, cap / pred_norm) : pred);
            }
            prediction = concat(images, 0);
          }
        }
        return neg(prediction);
      },
      [&](const Tensor& latents) {
        // latents.to(vae.dtype), then unscaled and unshifted in it.
        return pipelines::postprocess(vae_->decode(vae_->from_latents(latents.to(dtype_))));
      },
      guided, {}, control);
}

std::vector<std::pair<std::string, nn::Module*>> ZImagePipeline::components() const {
  return {{"text_encoder", text_encoder_.get()}, {"transformer", transformer_.get()}, {"vae", vae_.get()}};
}

models::LatentCodec& ZImagePipeline::latent_codec() const {
  return *vae_;
}

nn::Module& ZImagePipeline::denoiser() {
  return *transformer_;
}

ActivationEstimate ZImagePipeline::estimate_activations(const PipelineRequest& request,
                                                        const Device& device) const {
  const int64_t multiple = vae_->config().scale_factor() * 2;
  const pipelines::ResolvedRequest call =
      pipelines::resolve_with_image_size(request, defaults(), registered_class().edits_an_image(), multiple);
  const models::ZImageTransformerConfig& tc = transformer_->config();
  const models::DecoderTextEncoderConfig& te = text_encoder_->config();
  const int64_t batch = pipelines::batch_size(request);
  // The image's patches and the caption, each padded to 32 tokens; a guided step runs a batch of 2B.
  const int64_t tokens =
      (call.height / multiple) * (call.width / multiple) + 32 + call.max_sequence_length + 32;
  const int64_t text = call.max_sequence_length;
  const int64_t guided = call.guidance_scale > 0.0f ? 2 : 1;
  ActivationEstimate e{.height = call.height, .width = call.width};
  // Each prompt alone under a causal mask (no fused attention).
  e.text_encoders =
      block_stack_activation_bytes({.tokens = text,
                                    .width = std::max(te.hidden_size, te.num_attention_heads * te.head_dim),
                                    .mlp_width = te.intermediate_size,
                                    .heads = te.num_attention_heads,
                                    .fused_attention = false},
                                   dtype());
  e.transformer = block_stack_activation_bytes(
      {.batch = guided * batch,
       .tokens = tokens,
       .width = tc.dim,
       .mlp_width = tc.ffn_hidden(),
       .heads = tc.n_heads,
       .fused_attention = fuses_attention(device, dtype(), tc.head_dim()),
       .attention_key_block = attention_key_block(device, dtype(), tc.head_dim())},
      dtype());
  e.vae = vae_activation_bytes(*vae_, batch, call.height, call.width, dtype(), device);
  return e;
}

}  // namespace kiln
