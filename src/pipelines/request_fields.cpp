#include "kiln/pipelines/request_fields.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <type_traits>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"

namespace kiln {

namespace {

// ---- how each C++ type of a PipelineRequest member reads, writes and tells whether it is set

template <class T>
struct FieldType;

[[noreturn]] void wrong_kind(const std::string& field, FieldKind kind) {
  throw RequestError(field, field + " must be a " + std::string(field_kind_name(kind)));
}

template <class V>
const V& value_as(const std::string& field, FieldKind kind, const FieldValue& value) {
  if (const V* v = std::get_if<V>(&value)) return *v;
  wrong_kind(field, kind);
}

template <>
struct FieldType<std::string> {
  static constexpr FieldKind kind = FieldKind::Text;
  static bool is_set(const std::string& v, const std::string& unset) { return v != unset; }
  static FieldValue get(const std::string& v) { return v; }
  static void set(std::string& v, const std::string& field, const FieldValue& x) {
    v = value_as<std::string>(field, kind, x);
  }
};

template <class T>
struct FieldType<std::optional<T>> {
  using Inner = FieldType<T>;
  static constexpr FieldKind kind = Inner::kind;
  static bool is_set(const std::optional<T>& v, const std::optional<T>&) { return v.has_value(); }
  static FieldValue get(const std::optional<T>& v) { return Inner::get(*v); }
  static void set(std::optional<T>& v, const std::string& field, const FieldValue& x) {
    T inner{};
    Inner::set(inner, field, x);
    v = std::move(inner);
  }
};

template <class T>
requires std::is_integral_v<T> &&(!std::is_same_v<T, bool>)struct FieldType<T> {
  static constexpr FieldKind kind = FieldKind::Integer;
  static bool is_set(T v, T unset) { return v != unset; }
  static FieldValue get(T v) { return static_cast<int64_t>(v); }
  static void set(T& v, const std::string& field, const FieldValue& x) {
    v = static_cast<T>(value_as<int64_t>(field, kind, x));
  }
};

template <class T>
requires std::is_floating_point_v<T>
struct FieldType<T> {
  static constexpr FieldKind kind = FieldKind::Number;
  static bool is_set(T v, T unset) { return v != unset; }
  static FieldValue get(T v) { return static_cast<double>(v); }
  static void set(T& v, const std::string& field, const FieldValue& x) {
    // An integer is a number too (JSON's 4, Python's 4).
    if (const int64_t* i = std::get_if<int64_t>(&x)) {
      v = static_cast<T>(*i);
      return;
    }
    v = static_cast<T>(value_as<double>(field, kind, x));
  }
};

template <>
struct FieldType<bool> {
  static constexpr FieldKind kind = FieldKind::Boolean;
  static bool is_set(bool v, bool unset) { return v != unset; }
  static FieldValue get(bool v) { return v; }
  static void set(bool& v, const std::string& field, const FieldValue& x) {
    v = value_as<bool>(field, kind, x);
  }
};

// Lists, tensors, images and generators hold themselves; a list is set when it has elements.
template <class V, FieldKind K>
struct HeldFieldType {
  static constexpr FieldKind kind = K;
  static FieldValue get(const V& v) { return v; }
  static void set(V& v, const std::string& field, const FieldValue& x) { v = value_as<V>(field, kind, x); }
};
template <>
struct FieldType<std::vector<std::string>> : HeldFieldType<std::vector<std::string>, FieldKind::TextList> {
  static bool is_set(const std::vector<std::string>& v, const std::vector<std::string>&) {
    return !v.empty();
  }
};
template <>
struct FieldType<std::vector<int64_t>> : HeldFieldType<std::vector<int64_t>, FieldKind::IntegerList> {
  static bool is_set(const std::vector<int64_t>& v, const std::vector<int64_t>&) { return !v.empty(); }
};
template <>
struct FieldType<std::vector<Image>> : HeldFieldType<std::vector<Image>, FieldKind::ImageList> {
  static bool is_set(const std::vector<Image>& v, const std::vector<Image>&) { return !v.empty(); }
};
template <>
struct FieldType<Image> : HeldFieldType<Image, FieldKind::Image> {};
template <>
struct FieldType<Tensor> : HeldFieldType<Tensor, FieldKind::Tensor> {
  static bool is_set(const Tensor& v, const Tensor&) { return v.defined(); }
};
template <>
struct FieldType<Generator> : HeldFieldType<Generator, FieldKind::Generator> {};
template <>
struct FieldType<std::vector<Generator>> : HeldFieldType<std::vector<Generator>, FieldKind::GeneratorList> {
  static bool is_set(const std::vector<Generator>& v, const std::vector<Generator>&) { return !v.empty(); }
};

// output_type, by diffusers' names.
constexpr std::pair<OutputType, const char*> kOutputTypes[] = {
    {OutputType::Image, "pil"}, {OutputType::Array, "np"}, {OutputType::Latent, "latent"}};
template <>
struct FieldType<OutputType> {
  static constexpr FieldKind kind = FieldKind::Choice;
  static bool is_set(OutputType v, OutputType unset) { return v != unset; }
  static FieldValue get(OutputType v) {
    for (const auto& [type, name] : kOutputTypes)
      if (type == v) return std::string(name);
    return std::string("pil");
  }
  static void set(OutputType& v, const std::string& field, const FieldValue& x) {
    const std::string& name = value_as<std::string>(field, kind, x);
    for (const auto& [type, type_name] : kOutputTypes)
      if (name == type_name) v = type;
  }
};

// A field over the member `access` returns (a generic lambda: PipelineRequest& or const& -> the member).
template <class Access>
RequestField bound(RequestField f, Access access) {
  using Member = std::remove_cvref_t<decltype(access(std::declval<PipelineRequest&>()))>;
  using Type = FieldType<Member>;
  f.kind = Type::kind;
  f.is_set = [access](const PipelineRequest& r) {
    static const PipelineRequest unset;
    return Type::is_set(access(r), access(unset));
  };
  f.get = [access](const PipelineRequest& r) { return Type::get(access(r)); };
  f.set = [access, name = f.name](PipelineRequest& r, const FieldValue& value) {
    check_field_value(request_field(name), value);
    Type::set(access(r), name, value);
  };
  f.reset = [access](PipelineRequest& r) {
    static const PipelineRequest unset;
    access(r) = access(unset);
  };
  return f;
}

#define KILN_MEMBER(m)   \
  [](auto& r) -> auto& { \
    return r.m;          \
  }

constexpr double kMaxFloat = std::numeric_limits<float>::max();
constexpr double kMaxPrompt = static_cast<double>(limits::kMaxPromptBytes);
constexpr double kMaxSide = static_cast<double>(limits::kMaxImageSide);

// A field: its name, label, help, flag and JSON name; a text's size is bounded by default (other kinds lose
// the bound below).
RequestField field(std::string name, std::string label, std::string help, std::string flag = "",
                   std::string json = "") {
  RequestField f;
  f.name = std::move(name);
  f.label = std::move(label);
  f.help = std::move(help);
  f.max = kMaxPrompt;
  f.flag = std::move(flag);
  f.json = std::move(json);
  return f;
}

// A number's or an integer's field, within [min, max].
RequestField ranged(std::string name, std::string label, std::string help, double min, double max,
                    std::string flag = "", std::string json = "") {
  RequestField f =
      field(std::move(name), std::move(label), std::move(help), std::move(flag), std::move(json));
  f.min = min;
  f.max = max;
  return f;
}

// A number strictly between min and max.
RequestField open_ranged(std::string name, std::string label, std::string help, double min, double max,
                         std::string flag = "", std::string json = "") {
  RequestField f =
      ranged(std::move(name), std::move(label), std::move(help), min, max, std::move(flag), std::move(json));
  f.open = true;
  return f;
}

RequestField with_list_form(RequestField f, std::string list_form) {
  f.list_form = std::move(list_form);
  return f;
}

RequestField with_keyword(RequestField f, std::string keyword) {
  f.keyword = std::move(keyword);
  return f;
}

std::vector<RequestField> make_fields() {
  std::vector<RequestField> fields;
  const auto add = [&](RequestField f, auto access) { fields.push_back(bound(std::move(f), access)); };
  const double kLayers = static_cast<double>(limits::kMaxLayers);
  // ---- what to draw
  add(field("prompt_embeds", "Prompt embeddings",
            "the prompt's embeddings instead of the prompt (encode_prompt's, e.g. weighted)"),
      KILN_MEMBER(prompt_embeds));
  add(field("pooled_prompt_embeds", "Pooled prompt embeddings",
            "the pooled embeddings that go with prompt_embeds (FLUX.1, SD3)"),
      KILN_MEMBER(pooled_prompt_embeds));
  add(with_list_form(field("prompt", "Prompt", "the text to make an image of", "--prompt", "prompt"),
                     "prompts"),
      KILN_MEMBER(prompt));
  add(field("prompt_2", "Prompt 2",
            "the second text encoder's prompt (FLUX.1: T5's; SD3: CLIP-G's); prompt when absent",
            "--prompt-2", "prompt_2"),
      KILN_MEMBER(prompt_2));
  add(field("prompt_3", "Prompt 3", "the third text encoder's prompt (SD3: T5's); prompt when absent",
            "--prompt-3", "prompt_3"),
      KILN_MEMBER(prompt_3));
  add(field("prompts", "Prompts", "several prompts in one call, each making num_images_per_prompt images"),
      KILN_MEMBER(prompts));
  // ---- what not to draw
  add(field("negative_prompt_embeds", "Negative prompt embeddings",
            "the negative prompt's embeddings instead of the negative prompt"),
      KILN_MEMBER(negative_prompt_embeds));
  add(field("negative_pooled_prompt_embeds", "Negative pooled prompt embeddings",
            "the pooled embeddings that go with negative_prompt_embeds"),
      KILN_MEMBER(negative_pooled_prompt_embeds));
  add(with_list_form(field("negative_prompt", "Negative prompt",
                           "what the image should not show (classifier-free guidance)", "--negative-prompt",
                           "negative_prompt"),
                     "negative_prompts"),
      KILN_MEMBER(negative_prompt));
  add(field("negative_prompt_2", "Negative prompt 2",
            "the second text encoder's negative prompt; negative_prompt when absent", "--negative-prompt-2",
            "negative_prompt_2"),
      KILN_MEMBER(negative_prompt_2));
  add(field("negative_prompt_3", "Negative prompt 3",
            "the third text encoder's negative prompt; negative_prompt when absent", "--negative-prompt-3",
            "negative_prompt_3"),
      KILN_MEMBER(negative_prompt_3));
  add(field("negative_prompts", "Negative prompts", "one negative prompt per prompt of `prompts`"),
      KILN_MEMBER(negative_prompts));
  // ---- the images a call starts from or reads
  add(field(
          "image", "Image",
          "the image to edit or start from (image-to-image, inpainting, Fill, Kontext), or reference images "
          "(FLUX.2)",
          "--image", "image"),
      KILN_MEMBER(image));
  add(field("image_latents", "Image latents",
            "SDXL image-to-image, inpainting: latents [1 or B, C, h, w] to start from instead of an image "
            "(diffusers' image= as a latent tensor, e.g. a base's output_type latent output)"),
      KILN_MEMBER(image_latents));
  add(field("mask_image", "Mask",
            "inpainting's mask: white is repainted, black kept (gray binarised at half)", "--mask",
            "mask_image"),
      KILN_MEMBER(mask_image));
  add(ranged("padding_mask_crop", "Mask crop padding",
             "inpainting: repaint only the region around the mask, this many pixels wider on each side", 0,
             kMaxSide, "--padding-mask-crop", "padding_mask_crop"),
      KILN_MEMBER(padding_mask_crop));
  add(ranged("strength", "Strength", "how much of the image is redrawn (image-to-image, inpainting)", 0, 1,
             "--strength", "strength"),
      KILN_MEMBER(strength));
  add(open_ranged("denoising_end", "Denoising end",
                  "SDXL: stop at this fraction of the schedule (with output_type latent, the hand-off to a "
                  "refiner run with the same denoising_start)",
                  0, 1, "--denoising-end", "denoising_end"),
      KILN_MEMBER(denoising_end));
  add(open_ranged("denoising_start", "Denoising start",
                  "SDXL image-to-image, inpainting: start at this fraction of the schedule, from the image's "
                  "latents as they are (a base's denoising_end hand-off; strength ignored)",
                  0, 1, "--denoising-start", "denoising_start"),
      KILN_MEMBER(denoising_start));
  add(ranged("max_area", "Max area",
             "Kontext: the output's area in pixels (its aspect ratio is height x width's)", 256,
             kMaxSide * kMaxSide, "--max-area", "max_area"),
      KILN_MEMBER(max_area));
  add(with_keyword(field("auto_resize", "Auto resize",
                         "Kontext: resize the image to the trained resolution nearest its aspect ratio", "",
                         "auto_resize"),
                   "_auto_resize"),
      KILN_MEMBER(auto_resize));
  // ---- the size, the schedule, guidance
  add(ranged("height", "Height", "the image's height in pixels", 1, kMaxSide, "--height", "height"),
      KILN_MEMBER(height));
  add(ranged("width", "Width", "the image's width in pixels", 1, kMaxSide, "--width", "width"),
      KILN_MEMBER(width));
  add(ranged("num_inference_steps", "Steps", "denoising steps", 1,
             static_cast<double>(limits::kMaxInferenceSteps), "--steps", "steps"),
      KILN_MEMBER(num_inference_steps));
  add(ranged(
          "guidance_scale", "Guidance",
          "guidance scale: the embedded guidance (FLUX.1-dev, FLUX.2-dev) or classifier-free guidance's (on "
          "above 1)",
          0, kMaxFloat, "--guidance", "guidance"),
      KILN_MEMBER(guidance_scale));
  add(ranged("true_cfg_scale", "True CFG scale",
             "true classifier-free guidance's scale, with a negative prompt, on above 1 (each step runs the "
             "transformer twice)",
             0, kMaxFloat, "--true-cfg-scale", "true_cfg_scale"),
      KILN_MEMBER(true_cfg_scale));
  add(ranged("cfg_normalization", "CFG normalization",
             "Z-Image: cap the guided prediction's norm at this many times the prompt's (0: off; diffusers' "
             "True "
             "is 1)",
             0, kMaxFloat, "--cfg-normalization", "cfg_normalization"),
      KILN_MEMBER(cfg_normalization));
  add(ranged("cfg_truncation", "CFG truncation",
             "Z-Image: no guidance on the steps whose normalised time (1000 - t) / 1000 is above this (1: "
             "never)",
             0, 1, "--cfg-truncation", "cfg_truncation"),
      KILN_MEMBER(cfg_truncation));
  // ---- step caching
  add(field(
          "cache", "Step cache",
          "skip transformer work between neighbouring steps: fbcache:THRESHOLD (diffusers' First Block "
          "Cache, e.g. fbcache:0.12), magcache:THRESHOLD (MagCache, e.g. magcache:0.06), magcache:calibrate, "
          "taylorseer (TaylorSeer, e.g. taylorseer:interval=5), pab (Pyramid Attention Broadcast, e.g. "
          "pab:skip=2:range=100,800), fastercache (FasterCache, e.g. "
          "fastercache:skip=2:range=-1,681:weight=0.5), "
          "or none; unset: the transformer's "
          "enable_cache",
          "--cache", "cache"),
      KILN_MEMBER(cache));
  // ---- the UNet family's sampler, prompt and guidance options
  add(field("scheduler", "Sampler",
            "the UNet family's sampler instead of the folder's: euler, euler_a, dpmpp_2m, dpmpp_2m_karras, "
            "ddim, "
            "pndm or a diffusers scheduler class",
            "--scheduler", "scheduler"),
      KILN_MEMBER(scheduler));
  add(field("use_karras_sigmas", "Karras sigmas", "the sampler's noise levels on Karras et al.'s schedule",
            "--karras", "use_karras_sigmas"),
      KILN_MEMBER(use_karras_sigmas));
  add(ranged("clip_skip", "CLIP skip", "the prompt's embeddings from this many CLIP layers before the last",
             0, kLayers, "--clip-skip", "clip_skip"),
      KILN_MEMBER(clip_skip));
  add(ranged("guidance_rescale", "Guidance rescale",
             "pull the guided prediction's standard deviation towards the prompt's by this fraction (0: off)",
             0, 1, "--guidance-rescale", "guidance_rescale"),
      KILN_MEMBER(guidance_rescale));
  add(ranged("original_size", "Original size", "SDXL: the (height, width) the image is said to come from", 1,
             kMaxSide, "--original-size", "original_size"),
      KILN_MEMBER(original_size));
  add(ranged("target_size", "Target size", "SDXL: the (height, width) the image is said to be", 1, kMaxSide,
             "--target-size", "target_size"),
      KILN_MEMBER(target_size));
  add(ranged("crops_coords_top_left", "Crop corner",
             "SDXL: the (top, left) corner of the crop it is said to be", 0, kMaxSide,
             "--crops-coords-top-left", "crops_coords_top_left"),
      KILN_MEMBER(crops_coords_top_left));
  add(ranged("negative_original_size", "Negative original size",
             "SDXL: original_size for the negative prompt", 1, kMaxSide, "--negative-original-size",
             "negative_original_size"),
      KILN_MEMBER(negative_original_size));
  add(ranged("negative_target_size", "Negative target size", "SDXL: target_size for the negative prompt", 1,
             kMaxSide, "--negative-target-size", "negative_target_size"),
      KILN_MEMBER(negative_target_size));
  add(ranged("negative_crops_coords_top_left", "Negative crop corner",
             "SDXL: crops_coords_top_left for the negative prompt", 0, kMaxSide,
             "--negative-crops-coords-top-left", "negative_crops_coords_top_left"),
      KILN_MEMBER(negative_crops_coords_top_left));
  add(ranged("aesthetic_score", "Aesthetic score",
             "SDXL refiner: the aesthetic score (0-10, LAION's aesthetic predictor's scale) the image is "
             "said to "
             "have (default 6)",
             0, 10, "--aesthetic-score", "aesthetic_score"),
      KILN_MEMBER(aesthetic_score));
  add(ranged("negative_aesthetic_score", "Negative aesthetic score",
             "SDXL refiner: aesthetic_score for the negative prompt (default 2.5)", 0, 10,
             "--negative-aesthetic-score", "negative_aesthetic_score"),
      KILN_MEMBER(negative_aesthetic_score));
  // ---- randomness
  add(with_list_form(field("generator", "Seed",
                           "the random generator, from a seed (torch.Generator(\"cpu\")"
                           ".manual_seed(seed))",
                           "--seed", "seed"),
                     "generators"),
      KILN_MEMBER(generator));
  add(field("generators", "Generators",
            "one generator per image (each image the one its generator makes alone)"),
      KILN_MEMBER(generators));
  // ---- the text encoder, the batch
  add(ranged("max_sequence_length", "Tokens", "the text encoder's tokens (T5's, FLUX.2's)", 1,
             static_cast<double>(limits::kMaxSequenceLength), "--max-sequence-length", "max_sequence_length"),
      KILN_MEMBER(max_sequence_length));
  add(ranged("num_images_per_prompt", "Images", "images per prompt, made as one batch", 1,
             static_cast<double>(limits::kMaxImagesPerPrompt), "--num-images", "n"),
      KILN_MEMBER(num_images_per_prompt));
  // ---- SD3's skip-layer guidance
  add(ranged("skip_guidance_layers", "Skip layers",
             "skip-layer guidance: the transformer blocks skipped (7,8,9)", 0, kLayers,
             "--skip-guidance-layers", "skip_guidance_layers"),
      KILN_MEMBER(skip_layer_guidance.layers));
  add(ranged("skip_layer_guidance_scale", "Skip-layer scale", "skip-layer guidance's scale", -kMaxFloat,
             kMaxFloat, "--skip-layer-guidance-scale", "skip_layer_guidance_scale"),
      KILN_MEMBER(skip_layer_guidance.scale));
  add(ranged("skip_layer_guidance_start", "Skip-layer start",
             "skip-layer guidance: the fraction of the steps it starts at", 0, 1,
             "--skip-layer-guidance-start", "skip_layer_guidance_start"),
      KILN_MEMBER(skip_layer_guidance.start));
  add(ranged("skip_layer_guidance_stop", "Skip-layer stop",
             "skip-layer guidance: the fraction of the steps it stops at", 0, 1, "--skip-layer-guidance-stop",
             "skip_layer_guidance_stop"),
      KILN_MEMBER(skip_layer_guidance.stop));
  // ---- what comes back
  {
    RequestField f =
        field("output_type", "Output", "what the call returns: 8-bit images, the float array, the latents");
    for (const auto& [type, name] : kOutputTypes) f.choices.push_back(name);
    add(std::move(f), KILN_MEMBER(output_type));
  }
  // A text field's bound is its size in bytes; other kinds have none unless given above.
  for (RequestField& f : fields) {
    const bool bounded = f.kind == FieldKind::Integer || f.kind == FieldKind::IntegerList ||
                         f.kind == FieldKind::Number || f.kind == FieldKind::Text ||
                         f.kind == FieldKind::TextList;
    if (!bounded) f.min = f.max = std::nullopt;
  }
  return fields;
}

#undef KILN_MEMBER

std::string number_text(double v) {
  if (v == kMaxFloat) return "float's largest";
  if (v == -kMaxFloat) return "float's lowest";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

void check_text(const RequestField& field, const std::string& s) {
  if (field.max && static_cast<double>(s.size()) > *field.max)
    throw RequestError(field.name, field.name + " is " + std::to_string(s.size()) +
                                       " bytes, more than the maximum " + number_text(*field.max));
}

void check_number(const RequestField& field, double v) {
  if (field.within(v)) return;
  // Integers as the command line's and the server's limits say it ("height 1000000 exceeds the maximum
  // 16384"), numbers by their range.
  if (field.kind != FieldKind::Number && field.min && v < *field.min)
    throw RequestError(
        field.name, field.name + " " + number_text(v) + " is below the minimum " + number_text(*field.min));
  if (field.kind != FieldKind::Number && field.max && v > *field.max)
    throw RequestError(field.name,
                       field.name + " " + number_text(v) + " exceeds the maximum " + number_text(*field.max));
  throw RequestError(field.name, field.name + " must be " + field.range() + ", got " + number_text(v));
}

}  // namespace

const char* field_kind_name(FieldKind kind) {
  switch (kind) {
    case FieldKind::Text:
      return "text";
    case FieldKind::TextList:
      return "text list";
    case FieldKind::Integer:
      return "integer";
    case FieldKind::IntegerList:
      return "integer list";
    case FieldKind::Number:
      return "number";
    case FieldKind::Boolean:
      return "boolean";
    case FieldKind::Choice:
      return "choice";
    case FieldKind::Image:
      return "image";
    case FieldKind::ImageList:
      return "image list";
    case FieldKind::Tensor:
      return "tensor";
    case FieldKind::Generator:
      return "generator";
    case FieldKind::GeneratorList:
      return "generator list";
  }
  return "?";
}

bool RequestField::within(double v) const {
  return std::isfinite(v) && (!min || v > *min || (!open && v == *min)) &&
         (!max || v < *max || (!open && v == *max));
}

std::string RequestField::range() const {
  const bool unbounded_below = !min || *min == -kMaxFloat, unbounded_above = !max || *max == kMaxFloat;
  if (kind == FieldKind::Number) {
    if (unbounded_below && unbounded_above) return "a finite value";
    if (unbounded_above) return "a finite value >= " + number_text(*min);
    if (unbounded_below) return "a finite value <= " + number_text(*max);
    return (open ? "in (" : "in [") + number_text(*min) + ", " + number_text(*max) + (open ? ")" : "]");
  }
  if (min && max) return "between " + number_text(*min) + " and " + number_text(*max);
  if (min) return ">= " + number_text(*min);
  if (max) return "<= " + number_text(*max);
  return "";
}

std::string RequestField::accepted() const {
  switch (kind) {
    case FieldKind::Integer:
      return min || max ? "an integer " + range() : "an integer";
    case FieldKind::IntegerList:
      return min || max ? "a list of integers, each " + range() : "a list of integers";
    case FieldKind::Number:
      return "a number, " + range();
    case FieldKind::Text:
      return max ? "text of at most " + number_text(*max) + " bytes" : "text";
    case FieldKind::TextList:
      return max ? "a list of texts of at most " + number_text(*max) + " bytes each" : "a list of texts";
    case FieldKind::Choice: {
      std::string s = "one of";
      for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", \"" : " \"") + choices[i] + "\"";
      return s;
    }
    default:
      return std::string("a ") + field_kind_name(kind);
  }
}

const std::vector<RequestField>& request_fields() {
  static const std::vector<RequestField> fields = make_fields();
  return fields;
}

const RequestField* find_request_field(std::string_view name) {
  for (const RequestField& f : request_fields())
    if (f.name == name || (!f.keyword.empty() && f.keyword == name)) return &f;
  return nullptr;
}

const RequestField& request_field(std::string_view name) {
  if (const RequestField* f = find_request_field(name)) return *f;
  std::string known;
  for (const RequestField& f : request_fields()) known += (known.empty() ? "" : ", ") + f.name;
  KILN_FAIL("no request field '" << name << "' (the fields are " << known << ")");
}

void check_field_value(const RequestField& field, const FieldValue& value) {
  switch (field.kind) {
    case FieldKind::Text:
      check_text(field, value_as<std::string>(field.name, field.kind, value));
      return;
    case FieldKind::TextList:
      for (const std::string& s : value_as<std::vector<std::string>>(field.name, field.kind, value))
        check_text(field, s);
      return;
    case FieldKind::Integer:
      check_number(field, static_cast<double>(value_as<int64_t>(field.name, field.kind, value)));
      return;
    case FieldKind::IntegerList:
      for (int64_t v : value_as<std::vector<int64_t>>(field.name, field.kind, value))
        check_number(field, static_cast<double>(v));
      return;
    case FieldKind::Number:
      if (const int64_t* i = std::get_if<int64_t>(&value))
        return check_number(field, static_cast<double>(*i));
      check_number(field, value_as<double>(field.name, field.kind, value));
      return;
    case FieldKind::Choice: {
      const std::string& name = value_as<std::string>(field.name, field.kind, value);
      for (const std::string& c : field.choices)
        if (c == name) return;
      throw RequestError(field.name, field.name + " must be " + field.accepted() + ", got \"" + name + "\"");
    }
    case FieldKind::Boolean:
      value_as<bool>(field.name, field.kind, value);
      return;
    case FieldKind::Image:
      value_as<Image>(field.name, field.kind, value);
      return;
    case FieldKind::ImageList:
      value_as<std::vector<Image>>(field.name, field.kind, value);
      return;
    case FieldKind::Tensor:
      value_as<Tensor>(field.name, field.kind, value);
      return;
    case FieldKind::Generator:
      value_as<Generator>(field.name, field.kind, value);
      return;
    case FieldKind::GeneratorList:
      value_as<std::vector<Generator>>(field.name, field.kind, value);
      return;
  }
}

void check_field_ranges(const PipelineRequest& request) {
  for (const RequestField& f : request_fields())
    if (f.is_set(request)) check_field_value(f, f.get(request));
}

std::vector<const RequestField*> fields_set(const PipelineRequest& request) {
  std::vector<const RequestField*> set;
  for (const RequestField& f : request_fields())
    if (f.is_set(request)) set.push_back(&f);
  return set;
}

std::optional<FieldValue> default_of(const PipelineDefaults& d, const std::string& field) {
  if (field == "height") return d.height;
  if (field == "width") return d.width;
  if (field == "num_inference_steps") return static_cast<int64_t>(d.num_inference_steps);
  if (field == "guidance_scale") return static_cast<double>(d.guidance_scale);
  if (field == "max_sequence_length") return d.max_sequence_length;
  if (field == "strength") return d.strength;
  return std::nullopt;
}

}  // namespace kiln
