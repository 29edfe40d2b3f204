#include "kiln/families/chroma/chroma_pipeline.h"

#include <algorithm>
#include <optional>
#include <string>
#include <variant>

#include "families/chroma/chroma_single_file.h"
#include "families/family_helpers.h"
#include "kiln/core/log.h"
#include "kiln/families/chroma/chroma_transformer.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/t5_encoder.h"
#include "kiln/ops.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/schedulers/flow_match_euler.h"
#include "kiln/schedulers/timestep_shift.h"
#include "kiln/tokenizers/t5_tokenizer.h"
#include "pipelines/call_control.h"
#include "pipelines/call_generators.h"
#include "pipelines/denoise.h"
#include "pipelines/encoder_activations.h"
#include "pipelines/pipeline_common.h"
#include "pipelines/task_stages.h"

namespace kiln {

ChromaPipeline::ChromaPipeline() = default;
ChromaPipeline::ChromaPipeline(ChromaPipeline&&) noexcept = default;
ChromaPipeline& ChromaPipeline::operator=(ChromaPipeline&&) noexcept = default;
ChromaPipeline::~ChromaPipeline() = default;
ChromaPipeline::ChromaPipeline(const ChromaPipeline& pipe, SharingComponents)
    : DiffusionPipeline(pipe, SharingComponents{}),
      tokenizer_(pipe.tokenizer_),
      text_encoder_(pipe.text_encoder_),
      transformer_(pipe.transformer_),
      vae_(pipe.vae_),
      scheduler_(pipe.scheduler_) {}

ChromaPipeline ChromaPipeline::from_pipe(const ChromaPipeline& pipe) {
  return ChromaPipeline(pipe, SharingComponents{});
}
ChromaImg2ImgPipeline ChromaImg2ImgPipeline::from_pipe(const ChromaPipeline& pipe) {
  return ChromaImg2ImgPipeline(pipe, SharingComponents{});
}

ChromaPipeline ChromaPipeline::from_pretrained(const std::string& model, const PipelineLoadOptions& options) {
  ChromaPipeline pipe;
  load(pipe, model, options, "ChromaPipeline");
  return pipe;
}

ChromaImg2ImgPipeline ChromaImg2ImgPipeline::from_pretrained(const std::string& model,
                                                             const PipelineLoadOptions& options) {
  ChromaImg2ImgPipeline pipe;
  load(pipe, model, options, "ChromaImg2ImgPipeline");
  return pipe;
}

PipelineDefaults ChromaPipeline::family_defaults() const {
  return {.num_inference_steps = 35, .guidance_scale = 5.0f};
}

PipelineDefaults ChromaImg2ImgPipeline::family_defaults() const {
  return {.num_inference_steps = 35, .guidance_scale = 5.0f, .strength = 0.9};
}

void ChromaPipeline::load(ChromaPipeline& pipe, const std::string& model, const PipelineLoadOptions& options,
                          const char* pipeline_class) {
  pipelines::PipelineFolder folder(model, options, pipeline_class,
                                   {"ChromaPipeline", "ChromaImg2ImgPipeline"});
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
  pipe.tokenizer_ = std::make_unique<tokenizers::T5Tokenizer>(
      tokenizers::T5Tokenizer::from_directory(folder.need("tokenizer", {"T5Tokenizer", "T5TokenizerFast"})));
  done("tokenizer");
  const std::vector<std::string>& splittable = find_pipeline_class(pipeline_class)->splittable_components;
  pipe.text_encoder_ = models::load_t5_encoder(folder.need("text_encoder", {"T5EncoderModel"}), options.dtype,
                                               options.tensor_parallel_for("text_encoder", splittable));
  done("text_encoder");
  if (options.transformer_file.empty()) {
    pipe.transformer_ = models::load_chroma_transformer(
        folder.need("transformer", {"ChromaTransformer2DModel"}), options.dtype,
        options.tensor_parallel_for("transformer", splittable));
  } else {
    pipe.transformer_ = models::ChromaTransformer2DModel::from_single_file(
        options.transformer_file,
        {.config = single_file_transformer_config(folder.path(), options, pipeline_class),
         .dtype = options.dtype});
  }
  done("transformer");
  pipe.vae_ = models::load_autoencoder_kl(folder.need("vae", {"AutoencoderKL"}), options.dtype);
  done("vae");
  pipe.finish_loading(options.packed_weight_budget);
  const auto& tc = pipe.transformer_->config();
  KILN_CHECK(tc.joint_attention_dim == pipe.text_encoder_->config().d_model,
             pipe.path_ << ": transformer joint_attention_dim " << tc.joint_attention_dim
                        << " does not match text_encoder d_model " << pipe.text_encoder_->config().d_model);
  const int64_t packed = 4 * pipe.vae_->config().latent_channels;
  KILN_CHECK(tc.in_channels == packed && tc.out_channels == packed,
             pipe.path_ << ": transformer in_channels " << tc.in_channels << " and out_channels "
                        << tc.out_channels << " do not fit the vae's 2 x 2 packed latents (expected "
                        << packed << " for latent_channels " << pipe.vae_->config().latent_channels << ")");
}

ChromaPipeline::PromptEmbeddings ChromaPipeline::encode_prompt(const std::vector<std::string>& prompts,
                                                               int num_images_per_prompt,
                                                               int64_t max_sequence_length) const {
  std::vector<Tensor> embeds, masks;
  for (const std::string& prompt : prompts) {
    if (static_cast<int64_t>(tokenizer_->tokenize(prompt).size()) + 1 > max_sequence_length)
      warn("the prompt is longer than max_sequence_length (" + std::to_string(max_sequence_length) +
           " tokens) and was truncated");
    tokenizers::EncodeOptions options;
    options.max_length = max_sequence_length;
    const tokenizers::Encoding tokens = tokenizer_->encode(prompt, options);
    const auto length = static_cast<int64_t>(tokens.ids.size());
    // T5 attends over the prompt's tokens (and EOS) only.
    const Tensor ids = Tensor::from_vector(tokens.ids, {1, length});
    const Tensor tokenizer_mask = Tensor::from_vector(tokens.attention_mask, {1, length});
    embeds.push_back(text_encoder_->forward(ids, tokenizer_mask));
    // The transformer's mask keeps one more: the first padding token after EOS (Chroma's training recipe).
    const auto kept =
        static_cast<int64_t>(std::count(tokens.attention_mask.begin(), tokens.attention_mask.end(), 1));
    std::vector<float> mask(static_cast<size_t>(length), 0.0f);
    std::fill_n(mask.begin(), std::min(kept + 1, length), 1.0f);
    masks.push_back(Tensor::from_vector(mask, {1, length}));
  }
  PromptEmbeddings out;
  out.prompt_embeds = pipelines::repeat_per_prompt(concat(embeds, 0), num_images_per_prompt);
  const DType dtype = out.prompt_embeds.dtype();
  out.attention_mask = pipelines::repeat_per_prompt(concat(masks, 0).to(dtype), num_images_per_prompt);
  out.text_ids = models::flux_text_ids(out.prompt_embeds.size(1), dtype);
  return out;
}

void ChromaPipeline::check_loaded_request(const PipelineRequest& request) const {
  const char* name = class_name();
  const pipelines::ResolvedRequest r = pipelines::resolve(request, defaults());
  pipelines::check_image_size(name, r.height, r.width, vae_->config().scale_factor() * 2);
  pipelines::check_task_inputs(registered_class().task, name, request, r);
}

bool ChromaPipeline::negative_evaluations(const PipelineRequest& request) const {
  // As run() decides it (diffusers' do_classifier_free_guidance): the negative prompt in a call of its own.
  return pipelines::resolve(request, defaults()).guidance_scale > 1.0f;
}

PipelineOutput ChromaPipeline::run(const PipelineRequest& request, const pipelines::CallControl& control) {
  const pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  const int n = request.num_images_per_prompt;
  const std::vector<std::string> prompts = pipelines::prompt_list(request);
  // encode: the prompts, and with classifier-free guidance (guidance_scale > 1) one negative prompt each (""
  // when none is given); the text encoder's memory then goes to the transformer.
  const bool guided = call.guidance_scale > 1.0f;
  if (!guided && pipelines::has_negative_prompt(request))
    warn(std::string(class_name()) + ": negative_prompt is ignored unless guidance_scale > 1 (got " +
         std::to_string(call.guidance_scale) + "), as in diffusers");
  const PromptEmbeddings prompt = encode_prompt(prompts, n, call.max_sequence_length);
  std::optional<PromptEmbeddings> negative;
  if (guided) {
    std::vector<std::string> negatives;
    for (size_t i = 0; i < prompts.size(); ++i)
      negatives.push_back(pipelines::negative_prompt_of(request, i).value_or(""));
    negative = encode_prompt(negatives, n, call.max_sequence_length);
  }
  release_after_use({{"text_encoder", text_encoder_.get()}});

  pipelines::CallGenerators generators(request);
  const int64_t batch = pipelines::batch_size(request);
  const DType dtype = prompt.prompt_embeds.dtype();
  const int64_t f = vae_->config().scale_factor();
  const int64_t h = 2 * (call.height / (f * 2)), w = 2 * (call.width / (f * 2));
  const int64_t image_tokens = (h / 2) * (w / 2);

  // The call's own schedule, shifted by the image's token count (FLUX.1's).
  FlowMatchEulerDiscreteScheduler schedule = *scheduler_;
  schedule.set_timesteps(call.num_inference_steps, flux_sigmas(call.num_inference_steps),
                         calculate_shift(schedule.config(), image_tokens));

  const pipelines::TaskCall task{.task = registered_class().task,
                                 .pipeline = class_name(),
                                 .request = request,
                                 .call = call,
                                 .batch = batch,
                                 .dtype = dtype,
                                 .generators = generators,
                                 .schedule = schedule,
                                 .codec = *vae_,
                                 .pack = models::flux_pack_latents};
  const pipelines::TaskStart start = pipelines::start_latents(task);
  const Tensor image_ids = models::flux_latent_image_ids(h / 2, w / 2, dtype);
  // Each prompt's mask, then the image's tokens, all kept.
  const Tensor image_kept = Tensor::full({batch, image_tokens}, 1.0, dtype);
  const Tensor mask = concat({prompt.attention_mask, image_kept}, 1);
  const Tensor negative_mask = negative ? concat({negative->attention_mask, image_kept}, 1) : Tensor();
  // diffusers' text-to-image rounds t to the latents' dtype before dividing by 1000; image-to-image divides
  // in float32 (the transformer then rounds t / 1000).
  const bool round_first = registered_class().task == Task::TextToImage;
  const float guidance_scale = call.guidance_scale;

  // denoise, decode
  return denoise_and_decode(
      task, start,
      [&](const Tensor& x, int, float timestep) {
        const Tensor t = Tensor::full({batch}, timestep, float32);
        const Tensor scaled = div(round_first ? t.to(x.dtype()) : t, 1000.0);
        // The step cache's contexts: "cond", then "uncond" for the negative call (diffusers' ChromaPipeline
        // enters none, where its TaylorSeer refuses to run; the references enter these, as FLUX.1's
        // pipeline).
        cache_context("cond");
        const Tensor positive =
            transformer_->forward(x, prompt.prompt_embeds, scaled, prompt.text_ids, image_ids, mask);
        if (!negative) return positive;
        // diffusers: neg + guidance_scale * (pos - neg), two calls of batch B.
        cache_context("uncond");
        const Tensor uncond = transformer_->forward(x, negative->prompt_embeds, scaled, negative->text_ids,
                                                    image_ids, negative_mask);
        cache_context("cond");
        return add(uncond, mul(static_cast<double>(guidance_scale), sub(positive, uncond)));
      },
      [&](const Tensor& latents) {
        return pipelines::postprocess(
            vae_->decode(vae_->from_latents(models::flux_unpack_latents(latents, h, w))));
      },
      negative.has_value(), {}, control);
}

std::vector<std::pair<std::string, nn::Module*>> ChromaPipeline::components() const {
  return {{"text_encoder", text_encoder_.get()}, {"transformer", transformer_.get()}, {"vae", vae_.get()}};
}

models::LatentCodec& ChromaPipeline::latent_codec() const {
  return *vae_;
}

nn::Module& ChromaPipeline::denoiser() {
  return *transformer_;
}

ActivationEstimate ChromaPipeline::estimate_activations(const PipelineRequest& request,
                                                        const Device& device) const {
  const pipelines::ResolvedRequest call = pipelines::resolve(request, defaults());
  const models::ChromaTransformerConfig& tc = transformer_->config();
  const models::T5EncoderConfig& t5 = text_encoder_->config();
  const int64_t f = vae_->config().scale_factor() * 2;
  const int64_t batch = pipelines::batch_size(request);
  const int64_t tokens = (call.height / f) * (call.width / f) + call.max_sequence_length;
  const int64_t text = call.max_sequence_length;
  ActivationEstimate e{.height = call.height, .width = call.width};
  // T5's padding mask joins its position bias as float32 scores' bias [1, heads, L, L].
  e.text_encoders = pipelines::t5_activation_bytes(t5, text, dtype()) + t5.num_heads * text * text * 4;
  // The transformer's attention mask [B, 1, S, S] in the compute dtype, beside one step's blocks.
  e.transformer = pipelines::dit_step_activation_bytes(batch, tokens, tc.num_attention_heads,
                                                       tc.attention_head_dim, dtype(), device) +
                  batch * tokens * tokens * static_cast<int64_t>(dtype_size(dtype()));
  e.vae = vae_activation_bytes(*vae_, batch, call.height, call.width, dtype(), device);
  return e;
}

}  // namespace kiln
