// `kiln generate`: text to image with the pipeline named in the model's model_index.json, found in the
// library's registry (kiln/pipelines/pipeline_registry.h). This file only turns flags into a PipelineRequest,
// load options and execution options; options left out take that pipeline's diffusers defaults.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/device_flag.h"
#include "cli/execution_flags.h"
#include "cli/generate_args.h"
#include "cli/progress.h"
#include "cli/request_flags.h"
#include "cli/weight_traffic.h"
#include "kiln/core/bytes.h"
#include "kiln/dist/local_ranks.h"
#include "kiln/dist/process_group.h"
#include "kiln/io/model_index.h"
#include "kiln/io/model_ref.h"
#include "kiln/io/safetensors.h"
#include "kiln/lora/lora_keys.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/runtime/cross_compile.h"

namespace kiln::cli {

namespace {

// A weight as typed: 0.8, -0.5, 1.
std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.2fs" : "%.1fs", s);
  return buf;
}

// The flag that sets a request field, for errors (RequestError::field): an editing class's image is
// --init-image's.
std::string flag_for(const std::string& field, bool editing) {
  if (field == "image" && editing) return "--init-image";
  if (field == "image_latents") return "--init-latents";
  return flag_of(field);
}

// The request the flags describe, with placeholders for --init-image's image, so that a pipeline that does
// not take it refuses it before any file is read.
PipelineRequest request_from(const GenerateArgs& args, PipelineRequest request) {
  if (args.init_image) request.image.insert(request.image.begin(), Image());
  return request;
}

// Runs `check`, naming the flag of a refused request field.
template <class Check>
void with_flag_names(bool editing, Check check) {
  try {
    check();
  } catch (const RequestError& e) {
    KILN_FAIL(flag_for(e.field(), editing) << ": " << e.what());
  }
}

// The class that runs the flags: the folder's, or its image-to-image or inpainting sibling for --init-image
// and --mask (a FluxPipeline folder runs FluxInpaintPipeline with --mask).
const PipelineClass& class_for(const GenerateArgs& args, const io::ModelIndex& index) {
  const PipelineClass& folder = pipeline_class(index.class_name, index.path);
  if (!args.init_image && !args.init_latents) return folder;
  try {
    return class_for_images(folder, args.request.given("mask_image"));
  } catch (const RequestError& e) {
    KILN_FAIL((e.field() == "mask_image" ? "--mask: " : "--init-image: ")
              << e.what() << "; --image gives the images a pipeline takes as references or edits");
  }
}

Image read_image(const char* flag, const std::string& path, const char* what) {
  try {
    return Image::load(path);
  } catch (const Error& e) {
    KILN_FAIL(flag << " " << path << ": cannot be read as " << what << " (a PNG file): " << e.what());
  }
}

// The folder (or repo id) and single file that --model (and --config) name.
struct ModelArg {
  std::string model, single_file;
};
ModelArg model_arg(const GenerateArgs& args) {
  // A whole pipeline in one file runs on a folder's configs: --config, or its family's base model.
  std::string model = args.model, single_file;
  if (std::filesystem::is_regular_file(args.model)) {
    const SingleFilePipeline file = single_file_pipeline(args.model);
    single_file = args.model;
    model = args.config.empty() ? file.default_config : args.config;
    if (args.config.empty()) {
      try {
        io::resolve_model(model);
      } catch (const Error& e) {
        KILN_FAIL(args.model << ": a " << file.pipeline_class
                             << " file takes its configs, tokenizers and scheduler "
                             << "from the model it was finetuned from, " << model << ", which is not here ("
                             << e.what() << "); or give --config FOLDER");
      }
    }
  } else {
    KILN_CHECK(args.config.empty(), "--config " << args.config << ": only with a single file as --model ("
                                                << args.model << " is a folder or repo id)");
  }
  return {model, single_file};
}

// One pipeline's run on one rank (the only one without --tp): rank r works on the device r places after
// `first_device`; rank 0 alone reports and writes the image (or, with --output-latents, the latents). With
// `handed_on`, the call's latents come back there instead (the base's side of --refiner) and nothing is
// written.
void run_stage(const GenerateArgs& args, const PipelineRequest& flags, const Device& first_device,
               Tensor* handed_on) {
  const Device device = device_of_rank(first_device, dist::rank());
  require_device(device);
  const auto [model, single_file] = model_arg(args);
  const io::ResolvedModel resolved = io::resolve_model(model);
  const io::ModelIndex index = io::load_model_index(resolved.path);
  const PipelineClass& pipeline_class = class_for(args, index);
  const bool editing = pipeline_class.edits_an_image();
  PipelineRequest request = request_from(args, flags);
  with_flag_names(editing, [&] { pipeline_class.check_fields(request); });
  // Read before loading, so that a bad file fails at once.
  request.image.clear();
  if (args.init_image)
    request.image.push_back(read_image("--init-image", *args.init_image, "the initial image"));
  for (const std::string& path : image_paths(args.request, "image"))
    request.image.push_back(read_image("--image", path, "a reference image"));
  for (const std::string& path : image_paths(args.request, "mask_image"))
    request.mask_image = read_image("--mask", path, "a mask");

  // The LoRA files' names against the pipeline's family, before loading: a file of another layout or model
  // fails at once (its shapes are checked once the pipeline is loaded).
  for (const std::string& value : args.loras) {
    const LoraFlag lora = parse_lora_flag(value);
    try {
      const Family& family = *pipeline_class.family;
      KILN_CHECK(family.lora, pipeline_class.name << " does not take LoRA adapters");
      const lora::LoraKeys keys = lora::plan_lora_keys(io::SafetensorsFile(lora.path).names(), *family.lora);
      KILN_CHECK(keys.unknown.empty() || args.lora_skip_mismatches,
                 lora.path << ": tensor '" << keys.unknown.front().first
                           << "': " << keys.unknown.front().second
                           << " (--lora-skip-mismatches skips what does not fit)");
    } catch (const Error& e) {
      KILN_FAIL("--lora " << (std::string(e.what()).rfind(lora.path, 0) == 0 ? "" : lora.path + ": ")
                          << e.what());
    }
  }

  PipelineLoadOptions load = load_options_from(args.execution);
  load.transformer_file = args.transformer;
  load.single_file = single_file;
  // Rank 0 alone reports; the others work silently (their errors still go to stderr).
  const bool reporting = dist::rank() == 0;
  std::optional<ProgressBar> loading;
  load.on_component_loaded = [&](const std::string& name, int i, int n) {
    check_safe_point("after loading " + name);
    if (!reporting) return;
    if (!loading) loading.emplace("loading", n);
    loading->update(i, name);
  };
  const std::unique_ptr<DiffusionPipeline> pipe = pipeline_class.load(model, load);
  if (loading) loading->finish();
  // The packed copies are the cpu's matmuls'; on a device they are never made, so the plan is not reported.
  if (reporting && device.type == DeviceType::CPU)
    std::fprintf(stderr, "kiln: %s\n", pipe->weight_packing().describe().c_str());
  // Where the values of the flags left out come from: the folder's recommended call, or the family's
  // defaults.
  if (reporting && pipe->recommended_call())
    std::fprintf(stderr, "kiln: flags left out take %s's recommended call (%s)\n",
                 pipe->recommended_call()->path.c_str(), pipe->recommended_call()->describe().c_str());

  // LoRA adapters, each named after its file, at the weights given; fused into the weights with --fuse-lora.
  std::vector<std::string> adapters;
  std::vector<double> weights;
  std::string lora_metadata;
  for (const std::string& value : args.loras) {
    const LoraFlag lora = parse_lora_flag(value);
    std::string name = std::filesystem::path(lora.path).stem().string();
    while (std::find(adapters.begin(), adapters.end(), name) != adapters.end()) name += "_";
    lora::LoraLoadReport report;
    try {
      report = pipe->load_lora_weights(
          lora.path, {.adapter_name = name, .ignore_mismatches = args.lora_skip_mismatches});
    } catch (const Error& e) {
      KILN_FAIL("--lora " << e.what());
    }
    adapters.push_back(name);
    weights.push_back(lora.scale);
    lora_metadata += (lora_metadata.empty() ? "" : ", ") +
                     std::filesystem::path(lora.path).filename().string() + ":" + format_number(lora.scale);
    if (!reporting) continue;
    std::fprintf(stderr, "kiln: LoRA %s, weight %s: %s\n", lora.path.c_str(),
                 format_number(lora.scale).c_str(), report.describe().c_str());
    for (size_t i = 0; i < report.skipped.size() && i < 5; ++i)
      std::fprintf(stderr, "kiln:   skipped %s: %s\n", report.skipped[i].first.c_str(),
                   report.skipped[i].second.c_str());
    if (report.skipped.size() > 5)
      std::fprintf(stderr, "kiln:   ... and %zu more\n", report.skipped.size() - 5);
  }
  if (!adapters.empty()) pipe->set_adapters(adapters, weights);
  if (args.fuse_lora) {
    pipe->fuse_lora();
    lora_metadata += " (fused)";
    if (reporting) std::fprintf(stderr, "kiln: LoRA fused into the weights\n");
  }

  // On a device: offloaded onto it (the weights kept on the host), or every component moved there.
  for (const std::string& line : configure_pipeline(*pipe, args.execution, device, request))
    if (reporting) std::fprintf(stderr, "kiln: %s\n", line.c_str());
  if (const auto line = placement_line(*pipe, device); line && reporting)
    std::fprintf(stderr, "kiln: %s\n", line->c_str());

  // Like diffusers without a generator the noise is random, but the seed is reported and stored, so any
  // image can be made again.
  uint64_t seed = request.generator ? request.generator->initial_seed()
                                    : (uint64_t{std::random_device{}()} << 16) ^ std::random_device{}();
  dist::broadcast_from_rank0(&seed, sizeof seed);  // one noise for all ranks
  request.generator = Generator(seed);
  std::optional<ProgressBar> denoising;
  double total = 0;
  WeightTraffic traffic;  // offloaded weights coming back each step: from the disk, or streamed in groups
  request.callback_on_step_end = [&](StepState& step) {
    check_safe_point("after denoising step " + std::to_string(step.step + 1) + " of " +
                     std::to_string(step.num_steps));
    if (!reporting) return;
    if (!denoising) denoising.emplace("denoising", step.num_steps);
    total += step.seconds;
    const double eta = total / (step.step + 1) * (step.num_steps - step.step - 1);
    const std::string moved = traffic.since_last(pipe->context().memory());
    denoising->update(step.step + 1, format_seconds(step.seconds) + "/step, ETA " + format_seconds(eta) +
                                         (moved.empty() ? "" : ", " + moved));
  };
  if (handed_on || args.output_latents) request.output_type = OutputType::Latent;
  PipelineOutput out;
  with_flag_names(editing, [&] { out = (*pipe)(request); });
  if (handed_on) *handed_on = out.latents;
  if (!reporting) return;
  if (denoising) denoising->finish();
  if (handed_on) {
    std::fprintf(stderr, "kiln: %s stopped at denoising_end %s, its latents %s handed to the refiner\n",
                 args.model.c_str(), format_number(*request.denoising_end).c_str(),
                 out.latents.str().c_str());
    return;
  }
  if (args.output_latents) {
    std::map<std::string, std::string> metadata{{"model", args.model},
                                                {"pipeline", pipeline_class.name},
                                                {"seed", std::to_string(seed)},
                                                {"prompt", request.prompt}};
    if (request.denoising_end) metadata["denoising_end"] = format_number(*request.denoising_end);
    io::save_safetensors(*args.output_latents, {{"latents", out.latents.to(float32).contiguous()}}, metadata);
    std::fprintf(stderr, "kiln: wrote %s (latents %s, seed %llu)\n", args.output_latents->c_str(),
                 out.latents.str().c_str(), static_cast<unsigned long long>(seed));
    return;
  }
  for (size_t i = 0; i < out.images.size(); ++i) {
    Image& image = out.images[i];
    if (!lora_metadata.empty()) image.metadata["lora"] = lora_metadata;
    const std::string path =
        output_path(args.output, static_cast<int>(i), static_cast<int>(out.images.size()));
    image.save(path);
    std::fprintf(stderr, "kiln: wrote %s (%dx%d, seed %llu)\n", path.c_str(), image.width, image.height,
                 static_cast<unsigned long long>(seed));
  }
  if (!out.images.empty() && out.images[0].metadata.count("cache") > 0) {
    const std::string& reused = out.images[0].metadata.at("cache_reused");
    const std::string& spec = out.images[0].metadata.at("cache");
    // The attention caches reuse inside the blocks: TaylorSeer forecasts, PAB gives the last outputs again,
    // FasterCache extrapolates from the last two.
    const char* what = spec.rfind("taylorseer", 0) == 0    ? "the attentions were forecast at steps "
                       : spec.rfind("pab", 0) == 0         ? "the attentions were reused at steps "
                       : spec.rfind("fastercache", 0) == 0 ? "the attentions were extrapolated at steps "
                                                           : "the blocks were reused at steps ";
    std::fprintf(stderr, "kiln: step cache %s: %s\n", spec.c_str(),
                 reused == "none" ? "every step ran its blocks"
                                  : (what + reused + " (computed at the others)").c_str());
  }
  if (!out.images.empty() && out.images[0].metadata.count("mag_ratios") > 0)
    std::fprintf(stderr,
                 "kiln: MagCache calibration: the magnitude ratios of this model at %s steps are %s (use "
                 "them as --cache magcache:THRESHOLD:ratios=...)\n",
                 out.images[0].metadata.at("steps").c_str(), out.images[0].metadata.at("mag_ratios").c_str());
}

// The refiner's side of --refiner: its folder's image-to-image class (inpainting with --mask) from the base's
// latents at denoising_start = the base's denoising_end, the base's other flags as they are.
GenerateArgs refiner_args(const GenerateArgs& args) {
  GenerateArgs refine = args;
  refine.model = args.refiner;
  refine.config.clear();
  refine.transformer.clear();
  refine.loras.clear();  // the base's adapters
  refine.fuse_lora = refine.lora_skip_mismatches = false;
  refine.init_image.reset();
  refine.init_latents = "(the base's latents)";
  refine.refiner.clear();
  return refine;
}

PipelineRequest refiner_request(PipelineRequest request, const Tensor& latents) {
  request.denoising_start = request.denoising_end;
  request.denoising_end.reset();
  request.strength.reset();  // denoising_start replaces it
  request.image_latents = latents;
  return request;
}

// The whole command on one rank: one pipeline, or with --refiner the base then the refiner, each with a
// fresh generator of the same seed. The refiner's class and fields are checked before the base runs.
void generate_on_rank(const GenerateArgs& args, PipelineRequest flags, const Device& first_device) {
  if (args.refiner.empty()) return run_stage(args, flags, first_device, nullptr);
  const GenerateArgs refine = refiner_args(args);
  try {
    const auto [model, single_file] = model_arg(refine);
    const io::ModelIndex index = io::load_model_index(io::resolve_model(model).path);
    const PipelineClass& refiner_class = class_for(refine, index);
    PipelineRequest placeholder = refiner_request(flags, Tensor::zeros({1, 4, 1, 1}));
    if (args.request.given("mask_image")) placeholder.mask_image = Image();
    placeholder.image.clear();
    refiner_class.check_fields(placeholder);
  } catch (const Error& e) {
    KILN_FAIL("--refiner " << args.refiner << ": " << e.what());
  }
  if (!flags.generator) {
    uint64_t seed = (uint64_t{std::random_device{}()} << 16) ^ std::random_device{}();
    dist::broadcast_from_rank0(&seed, sizeof seed);
    flags.generator = Generator(seed);
  }
  Tensor latents;
  run_stage(args, flags, first_device, &latents);
  try {
    run_stage(refine, refiner_request(flags, latents), first_device, nullptr);
  } catch (const Error& e) {
    KILN_FAIL("--refiner " << args.refiner << ": " << e.what());
  }
}

// "kiln: cross-compiled 64 programs for tpu:v5e (TPU v5 lite) in 59.7 s; the largest needs 1.2 MiB there
// (region[...]), the most scratch 96 KiB (...)" per KILN_PJRT_CROSS_COMPILE target.
void print_cross_compile_summary() {
  const auto shorter = [](const std::string& what) {
    return what.size() <= 100 ? what : what.substr(0, 97) + "...";
  };
  const std::vector<CrossCompileSummary> summary = cross_compile_summary();
  const char* asked = std::getenv("KILN_PJRT_CROSS_COMPILE");
  if (summary.empty() && asked && *asked)
    std::fprintf(
        stderr,
        "kiln: KILN_PJRT_CROSS_COMPILE=%s compiled nothing: it compiles the programs a PJRT device runs "
        "(--device xla-cpu on a host without accelerators), and this run used none\n",
        asked);
  for (const CrossCompileSummary& s : summary) {
    const std::string scratch = s.largest_scratch_bytes == 0
                                    ? "none needs scratch"
                                    : "the most scratch " + format_bytes(s.largest_scratch_bytes) + " (" +
                                          shorter(s.largest_scratch_program) + ")";
    std::fprintf(stderr,
                 "kiln: cross-compiled %lld programs for %s (%s) in %.1f s; the largest run needs %s there "
                 "(arguments, outputs, scratch: %s), %s\n",
                 static_cast<long long>(s.programs), s.target.c_str(), s.device_kind.c_str(), s.seconds,
                 format_bytes(s.largest_program_bytes).c_str(), shorter(s.largest_program).c_str(),
                 scratch.c_str());
  }
}

void run_generate(const GenerateArgs& args) {
  const PipelineRequest request = check_generate_args(args);
  run_on_tensor_parallel_ranks(args.execution, "generate",
                               [&](const Device& device) { generate_on_rank(args, request, device); });
  print_cross_compile_summary();
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate an image from a text prompt");
  cmd->add_option(
         "--model", args->model,
         "diffusers folder or Hugging Face repo id in the local cache, or a whole pipeline in one file "
         "(an SD1.x / SDXL finetune's .safetensors)")
      ->required();
  cmd->add_option(
      "--config", args->config,
      "with a single file as --model: the diffusers folder or repo id whose configs, tokenizers and "
      "scheduler it takes (default: the base model it was finetuned from, e.g. "
      "stabilityai/stable-diffusion-xl-base-1.0, in the local cache)");
  cmd->add_option(
      "--transformer", args->transformer,
      "the transformer from one file instead of the model's transformer/: the original layout as "
      ".safetensors (flux1-dev.safetensors, sd3.5_medium.safetensors) or a GGUF quantization (.gguf, kept "
      "quantized)");
  add_request_flags(*cmd, args->request);
  cmd->get_option("--prompt")->required();
  cmd->add_option(
      "--init-image", args->init_image,
      "image-to-image: the image (PNG) to start from, resized to --height x --width; with --mask, inpainting "
      "(the folder's image-to-image or inpainting pipeline runs, as diffusers' siblings load its folder)");
  cmd->add_option(
      "--init-latents", args->init_latents,
      "SDXL image-to-image / inpainting: start from these latents (a .safetensors, as --output-latents "
      "writes "
      "it) instead of --init-image; with --denoising-start, a refiner continuing a base's --denoising-end");
  cmd->add_option(
      "--output-latents", args->output_latents,
      "write the call's latents (.safetensors, as the denoising loop leaves them) instead of a PNG: "
      "with --denoising-end, the base's side of a hand-off to a refiner (--init-latents)");
  cmd->add_option(
      "--refiner", args->refiner,
      "SDXL's ensemble of expert denoisers in one run: --model stops at --denoising-end and this "
      "refiner (a folder, repo id or single file) denoises the rest from its latents, each from a "
      "fresh generator of the same seed; --lora applies to --model only");
  cmd->add_option("--output", args->output,
                  "PNG file to write; with --num-images N, OUTPUT-0.png ... OUTPUT-(N-1).png")
      ->capture_default_str();
  cmd->add_option(
         "--lora", args->loras,
         "a LoRA file (.safetensors: diffusers/PEFT, kohya, Black Forest Labs or XLabs layout) and its "
         "weight, FILE[:SCALE] (default weight 1); repeat for several, applied together as diffusers' "
         "set_adapters(names, weights). Unfused: run beside the base weights")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag(
      "--fuse-lora", args->fuse_lora,
      "fuse the --lora adapters into the weights before generating (diffusers' fuse_lora: faster steps, "
      "a copy of each adapted weight)");
  cmd->add_flag("--lora-skip-mismatches", args->lora_skip_mismatches,
                "load the --lora files skipping the layers the model lacks or whose shapes differ (each is "
                "reported) instead of failing");
  add_execution_flags(*cmd, args->execution, "reports and writes the PNG");
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace kiln::cli
