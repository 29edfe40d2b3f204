// `kiln generate`: text to image with the pipeline named in the model's model_index.json (FluxPipeline,
// StableDiffusion3Pipeline, Flux2Pipeline, Flux2KleinPipeline), found in a registry keyed by that class name.
// Options left out take that pipeline's diffusers defaults.
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cli/commands.h"
#include "cli/generate_args.h"
#include "cli/progress.h"
#include "cli/weight_traffic.h"
#include "kiln/dist/device_mesh.h"
#include "kiln/dist/process_group.h"
#include "kiln/io/model_index.h"
#include "kiln/io/model_ref.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/pipelines/flux2_pipeline.h"
#include "kiln/pipelines/flux_pipeline.h"
#include "kiln/pipelines/sd3_pipeline.h"
#include "kiln/runtime/eager_mode.h"

namespace kiln::cli {

namespace {

// --tp N: the process group must already hold N ranks (mpirun -np N, or `kiln launch -n N`); the transformer
// and the large text encoder (T5, FLUX.2's) are split over them.
void join_tensor_parallel_group(const GenerateArgs& args) {
  if (args.tp == 1 && !dist::launched_by_mpirun()) return;
  if (!dist::is_initialized()) dist::init_process_group({.backend = "mpi"});
  KILN_CHECK(dist::world_size() == args.tp,
             "--tp " << args.tp << ": " << dist::world_size() << " process(es) were started; run `mpirun -np "
                     << args.tp << " kiln generate --tp " << args.tp << " ...` or `kiln launch -n " << args.tp
                     << " -- generate ...` (and give --tp the number of processes)");
}

// --mode: how the ops run (kiln/runtime/eager_mode.h, kiln/nn/compile.h). The transformer is what compiled
// modes compile; the encoders and the VAE run once per image and stay eager.
template <typename Pipeline>
void apply_mode(const std::string& mode, Pipeline& pipe) {
  if (mode == "eager") return;
  if (mode == "fuse") {
    set_eager_mode(EagerMode::DeferAndFuse);
  } else if (mode == "compile") {
    pipe.transformer().compile({.fullgraph = true, .dynamic = false});
  } else if (mode == "compile-blocks") {
    pipe.transformer().compile_repeated_blocks();
  } else {
    KILN_FAIL("--mode: expected eager, fuse, compile or compile-blocks, got '" << mode << "'");
  }
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.2fs" : "%.1fs", s);
  return buf;
}

// Loads the pipeline with a progress bar (`components` loading steps), runs `call` (the fields every pipeline
// has filled from `args`) with a denoising progress bar, and saves the first image. --tp splits the
// `splittable` components.
template <typename Pipeline, typename Call>
void load_and_run(const GenerateArgs& args, Call call, int components,
                  const std::vector<std::string>& splittable) {
  PipelineLoadOptions load;
  load.dtype = parse_dtype(args.dtype);
  if (args.packed_weights)
    load.packed_weight_budget = parse_byte_budget(*args.packed_weights, "--packed-weights");
  load.transformer_file = args.transformer;
  // Rank 0 alone reports; the others work silently (their errors still go to stderr).
  const bool reporting = dist::rank() == 0;
  std::optional<ProgressBar> loading;
  if (reporting) loading.emplace("loading", components);
  load.on_component_loaded = [&](const std::string& name, int i, int) {
    check_safe_point("after loading " + name);
    if (loading) loading->update(i, name);
  };
  if (args.tp > 1) {
    const dist::TensorParallelConfig parallel{.mesh = dist::DeviceMesh("cpu", {args.tp})};
    for (const std::string& component : splittable) load.parallel_config.emplace(component, parallel);
  }
  Pipeline pipe = Pipeline::from_pretrained(args.model, load);
  if (loading) loading->finish();
  if (reporting) std::fprintf(stderr, "kiln: %s\n", pipe.weight_packing().describe().c_str());
  // auto: a pipeline whose weights exceed half of the machine's memory (nothing packed) frees each
  // component's pages once it has run, so that the page cache holds the transformer while it denoises.
  const bool too_big = pipe.weight_packing().budget.has_value() && !pipe.weight_packing().requested;
  if (args.max_memory) {
    const OffloadPlan plan = pipe.set_memory_budget(parse_byte_budget(*args.max_memory, "--max-memory"));
    if (reporting) std::fprintf(stderr, "kiln: %s\n", plan.describe().c_str());
  } else if (args.offload == "group") {
    pipe.enable_group_offload({.blocks_per_group = args.blocks_per_group.value_or(1), .prefetch = true});
    if (reporting)
      std::fprintf(stderr,
                   "kiln: group offload: %d block(s) per group, the next group brought in while one runs\n",
                   args.blocks_per_group.value_or(1));
  } else if (args.offload == "sequential") {
    pipe.enable_sequential_cpu_offload();
    if (reporting)
      std::fprintf(stderr, "kiln: sequential offload: each weight is released once the next one is read\n");
  } else if (args.offload == "model" || (args.offload == "auto" && too_big)) {
    pipe.enable_model_cpu_offload();
    if (reporting)
      std::fprintf(stderr, "kiln: model offload: each component's weights are released once it has run\n");
  }
  if (args.vae_tiling) pipe.enable_vae_tiling(args.vae_tile_size ? *args.vae_tile_size : 0);
  apply_mode(args.mode, pipe);

  call.prompt = args.prompt;
  if (args.steps) call.num_inference_steps = *args.steps;
  if (args.height) call.height = *args.height;
  if (args.width) call.width = *args.width;
  if (args.guidance) call.guidance_scale = *args.guidance;
  if (args.max_sequence_length) call.max_sequence_length = *args.max_sequence_length;
  // Like diffusers without a generator the noise is random, but the seed is reported and stored, so any
  // image can be made again.
  uint64_t seed = args.seed ? *args.seed : (uint64_t{std::random_device{}()} << 16) ^ std::random_device{}();
  dist::broadcast_from_rank0(&seed, sizeof seed);  // one noise for all ranks
  call.generator = Generator(seed);
  std::optional<ProgressBar> denoising;
  if (reporting) denoising.emplace("denoising", call.num_inference_steps);
  double total = 0;
  WeightTraffic traffic;  // offloaded weights coming back each step: from the disk, or streamed in groups
  call.on_step_end = [&](int i, int n, double seconds) {
    check_safe_point("after denoising step " + std::to_string(i + 1) + " of " + std::to_string(n));
    total += seconds;
    const double eta = total / (i + 1) * (n - i - 1);
    const std::string moved = traffic.since_last();
    if (denoising)
      denoising->update(i + 1, format_seconds(seconds) + "/step, ETA " + format_seconds(eta) +
                                   (moved.empty() ? "" : ", " + moved));
  };
  PipelineOutput out = pipe(call);
  if (!reporting) return;
  denoising->finish();
  out.images.front().save(args.output);
  std::fprintf(stderr, "kiln: wrote %s (%dx%d, seed %llu)\n", args.output.c_str(), out.images.front().width,
               out.images.front().height, static_cast<unsigned long long>(seed));
}

void reject_reference_images(const GenerateArgs& args, const char* pipeline) {
  KILN_CHECK(args.images.empty(), "--image: " << pipeline
                                              << " takes no reference images (Flux2Pipeline and "
                                                 "Flux2KleinPipeline do)");
}

void run_flux(const GenerateArgs& args, const io::ModelIndex&) {
  KILN_CHECK(!args.negative_prompt,
             "--negative-prompt: FluxPipeline has no negative prompt (FLUX.1 is "
             "guidance-distilled; it runs without classifier-free guidance)");
  reject_reference_images(args, "FluxPipeline");
  FluxPipelineCall call;
  if (!args.prompt_2.empty()) call.prompt_2 = args.prompt_2;
  load_and_run<FluxPipeline>(args, call, 7, {"transformer", "text_encoder_2"});
}

void run_sd3(const GenerateArgs& args, const io::ModelIndex& index) {
  reject_reference_images(args, "StableDiffusion3Pipeline");
  StableDiffusion3PipelineCall call;
  if (!args.prompt_2.empty()) call.prompt_3 = args.prompt_2;  // --prompt-2 is the T5 prompt in both pipelines
  call.negative_prompt = args.negative_prompt;
  const io::PipelineComponent* t5 = index.find("text_encoder_3");
  load_and_run<StableDiffusion3Pipeline>(args, call, t5 != nullptr && t5->present() ? 9 : 7,
                                         {"transformer", "text_encoder_3"});
}

// Flux2Pipeline (FLUX.2-dev: no negative prompt, the guidance is embedded) and Flux2KleinPipeline (the
// negative prompt of its classifier-free guidance, "" by default as in diffusers).
template <typename Pipeline>
void run_flux2(const GenerateArgs& args, const io::ModelIndex& index) {
  const bool klein = std::is_same_v<Pipeline, Flux2KleinPipeline>;
  const std::string& name = index.class_name;
  KILN_CHECK(args.prompt_2.empty(), "--prompt-2: " << name << " has one text encoder and one prompt");
  KILN_CHECK(klein || !args.negative_prompt,
             "--negative-prompt: Flux2Pipeline has no negative prompt (FLUX.2-dev is guidance-distilled: "
             "--guidance is embedded, without classifier-free guidance)");
  const io::PipelineComponent* text_encoder = index.find("text_encoder");
  KILN_CHECK(text_encoder != nullptr && text_encoder->present(),
             index.path << ": this " << name
                        << " has no text encoder (text_encoder is null in model_index.json), which kiln "
                           "generate needs to encode --prompt");
  Flux2PipelineCall call;
  if (args.negative_prompt) call.negative_prompt = *args.negative_prompt;
  // Read before loading, so that a bad file fails at once.
  for (const std::string& path : args.images) {
    try {
      call.image.push_back(Image::load(path));
    } catch (const Error& e) {
      KILN_FAIL("--image " << path << ": cannot be read as a reference image (a PNG file): " << e.what());
    }
  }
  load_and_run<Pipeline>(args, call, 5, {"transformer", "text_encoder"});
}

// model_index.json's _class_name -> how kiln generate runs that pipeline.
using PipelineRunner = void (*)(const GenerateArgs&, const io::ModelIndex&);
const std::map<std::string, PipelineRunner>& pipeline_registry() {
  static const std::map<std::string, PipelineRunner> registry = {
      {"FluxPipeline", run_flux},
      {"StableDiffusion3Pipeline", run_sd3},
      {"Flux2Pipeline", run_flux2<Flux2Pipeline>},
      {"Flux2KleinPipeline", run_flux2<Flux2KleinPipeline>},
  };
  return registry;
}

void run_generate(const GenerateArgs& args) {
  check_generate_args(args);
  join_tensor_parallel_group(args);
  const io::ResolvedModel resolved = io::resolve_model(args.model);
  const io::ModelIndex index = io::load_model_index(resolved.path);
  const auto& registry = pipeline_registry();
  const auto runner = registry.find(index.class_name);
  if (runner == registry.end()) {
    std::string known;
    for (const auto& [name, run] : registry) known += (known.empty() ? "" : ", ") + name;
    KILN_FAIL(index.path << ": pipeline class '" << index.class_name << "' is not supported (Kiln runs "
                         << known << ")");
  }
  runner->second(args, index);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate an image from a text prompt");
  cmd->add_option("--model", args->model, "diffusers folder or Hugging Face repo id in the local cache")
      ->required();
  cmd->add_option(
      "--transformer", args->transformer,
      "the transformer from one file instead of the model's transformer/: the original layout as "
      ".safetensors (flux1-dev.safetensors, sd3.5_medium.safetensors) or a GGUF quantization (.gguf, kept "
      "quantized)");
  cmd->add_option("--prompt", args->prompt, "the prompt")->required();
  cmd->add_option("--prompt-2", args->prompt_2, "a separate prompt for the T5 encoder (default: --prompt)");
  cmd->add_option("--negative-prompt", args->negative_prompt,
                  "what the image should not show (StableDiffusion3Pipeline, Flux2KleinPipeline: the "
                  "classifier-free guidance's negative prompt; default: empty)");
  cmd->add_option("--image", args->images,
                  "a reference image (PNG) conditioning the generation, as diffusers' image= (Flux2Pipeline, "
                  "Flux2KleinPipeline); repeat for several. Without --height/--width the image takes the "
                  "first one's size (cropped to multiples of 16)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--height", args->height,
                  "image height in pixels, a multiple of 16 (default: the model's, 1024)");
  cmd->add_option("--width", args->width,
                  "image width in pixels, a multiple of 16 (default: the model's, 1024)");
  cmd->add_option(
      "--steps", args->steps,
      "number of denoising steps (default: the pipeline's, 28 for FLUX.1 and SD3, 50 for FLUX.2)");
  cmd->add_option("--guidance", args->guidance,
                  "guidance scale (default: 3.5 for FLUX.1-dev's guidance embedding, 7.0 for SD3's "
                  "classifier-free guidance, 4.0 for FLUX.2: FLUX.2-dev's embedding, klein's "
                  "classifier-free guidance, which step-distilled klein models ignore)");
  cmd->add_option("--seed", args->seed,
                  "random seed (as torch.Generator(\"cpu\").manual_seed); random when absent");
  cmd->add_option("--dtype", args->dtype, "compute dtype: bf16, f32 or f16")
      ->check(CLI::IsMember({"bf16", "f32", "f16", "bfloat16", "float32", "float16"}))
      ->capture_default_str();
  cmd->add_option("--max-sequence-length", args->max_sequence_length,
                  "text encoder tokens (T5's, FLUX.2's), at most 512 (default: 512 for FLUX.1 and FLUX.2, "
                  "256 for SD3)");
  cmd->add_option("--output", args->output, "PNG file to write")->capture_default_str();
  cmd->add_option(
         "--mode", args->mode,
         "execution mode: eager (strict eager, the default), fuse (deferred and fused), compile (the "
         "transformer compiled per shape), compile-blocks (its repeated blocks compiled once each)")
      ->check(CLI::IsMember({"eager", "fuse", "compile", "compile-blocks"}));
  cmd->add_option(
      "--packed-weights", args->packed_weights,
      "the most memory for packed copies of the weights (faster matmuls): a size such as 12GiB or "
      "512MiB, all, or none (default: all when the weights fit in half of this machine's memory, "
      "none otherwise: they are then read from the memory-mapped checkpoint, as diffusers does)");
  cmd->add_option("--offload", args->offload,
                  "model: each component's weights are released once it has run (diffusers' "
                  "enable_model_cpu_offload); group: weights read in place, a component's repeated blocks "
                  "in groups of --blocks-per-group, the next group brought in while one runs "
                  "(enable_group_offload); sequential: no packed copies and each weight released once the "
                  "next is read (enable_sequential_cpu_offload); none: every component keeps them; auto "
                  "(default): model when the weights exceed half of this machine's memory")
      ->check(CLI::IsMember({"auto", "none", "model", "group", "sequential"}))
      ->capture_default_str();
  cmd->add_option("--blocks-per-group", args->blocks_per_group,
                  "blocks per group for --offload group (diffusers' num_blocks_per_group; default 1)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option(
      "--max-memory", args->max_memory,
      "the most memory the weights may hold, e.g. 12GiB: picks the coarsest offload that stays under "
      "it (none, model, group, sequential) and fails before any work when the largest weight does not fit; "
      "activations come on top");
  cmd->add_flag(
      "--vae-tiling", args->vae_tiling,
      "decode in overlapping, blended tiles (diffusers' enable_vae_tiling): memory bounded by the tile");
  cmd->add_option(
         "--vae-tile-size", args->vae_tile_size,
         "tile size in pixels for --vae-tiling (default: the VAE's sample_size, 1024 for FLUX.1 and SD3)")
      ->check(CLI::PositiveNumber);
  cmd->add_option(
         "--tp", args->tp,
         "tensor-parallel degree: split the transformer and the T5 encoder (FLUX.2: its text encoder) over "
         "this many processes, "
         "started by `mpirun -np N` or `kiln launch -n N`; rank 0 reports and writes the PNG")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace kiln::cli
