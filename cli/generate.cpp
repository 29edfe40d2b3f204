// `kiln generate`: text to image with the pipeline named in the model's model_index.json.
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "cli/commands.h"
#include "cli/progress.h"
#include "kiln/io/model_index.h"
#include "kiln/io/model_ref.h"
#include "kiln/pipelines/flux_pipeline.h"

namespace kiln::cli {

namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_2;
  int64_t height = 1024;
  int64_t width = 1024;
  int steps = 28;
  float guidance = 3.5f;
  std::optional<uint64_t> seed;
  std::string dtype = "bf16";
  int64_t max_sequence_length = 512;
  std::string output = "output.png";
};

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.2fs" : "%.0fs", s);
  return buf;
}

void run_generate(const GenerateArgs& args) {
  const io::ResolvedModel resolved = io::resolve_model(args.model);
  const io::ModelIndex index = io::load_model_index(resolved.path);
  KILN_CHECK(index.class_name == "FluxPipeline",
             index.path << ": pipeline class '" << index.class_name << "' is not supported (Kiln runs FluxPipeline)");

  PipelineLoadOptions load;
  load.dtype = parse_dtype(args.dtype);
  ProgressBar loading("loading", 7);
  load.on_component_loaded = [&](const std::string& name, int i, int n) { loading.update(i, name); };
  FluxPipeline pipe = FluxPipeline::from_pretrained(args.model, load);
  loading.finish();

  FluxPipelineCall call;
  call.prompt = args.prompt;
  if (!args.prompt_2.empty()) call.prompt_2 = args.prompt_2;
  call.height = args.height;
  call.width = args.width;
  call.num_inference_steps = args.steps;
  call.guidance_scale = args.guidance;
  call.max_sequence_length = args.max_sequence_length;
  // Like diffusers without a generator the noise is random, but the seed is reported and stored, so any
  // image can be made again.
  const uint64_t seed = args.seed ? *args.seed : (uint64_t{std::random_device{}()} << 16) ^ std::random_device{}();
  call.generator = Generator(seed);
  ProgressBar denoising("denoising", args.steps);
  double total = 0;
  call.on_step_end = [&](int i, int n, double seconds) {
    total += seconds;
    const double eta = total / (i + 1) * (n - i - 1);
    denoising.update(i + 1, format_seconds(seconds) + "/step, ETA " + format_seconds(eta));
  };
  PipelineOutput out = pipe(call);
  denoising.finish();
  out.images.front().save(args.output);
  std::fprintf(stderr, "kiln: wrote %s (%dx%d, seed %llu)\n", args.output.c_str(), out.images.front().width,
               out.images.front().height, static_cast<unsigned long long>(seed));
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate an image from a text prompt");
  cmd->add_option("--model", args->model, "diffusers folder or Hugging Face repo id in the local cache")->required();
  cmd->add_option("--prompt", args->prompt, "the prompt")->required();
  cmd->add_option("--prompt-2", args->prompt_2, "a separate prompt for the T5 encoder (default: --prompt)");
  cmd->add_option("--height", args->height, "image height in pixels, a multiple of 16")->capture_default_str();
  cmd->add_option("--width", args->width, "image width in pixels, a multiple of 16")->capture_default_str();
  cmd->add_option("--steps", args->steps, "number of denoising steps")->capture_default_str();
  cmd->add_option("--guidance", args->guidance, "guidance scale (models with guidance embeddings)")->capture_default_str();
  cmd->add_option("--seed", args->seed, "random seed (as torch.Generator(\"cpu\").manual_seed); random when absent");
  cmd->add_option("--dtype", args->dtype, "compute dtype: bf16, f32 or f16")
      ->check(CLI::IsMember({"bf16", "f32", "f16", "bfloat16", "float32", "float16"}))
      ->capture_default_str();
  cmd->add_option("--max-sequence-length", args->max_sequence_length, "T5 tokens (at most 512)")->capture_default_str();
  cmd->add_option("--output", args->output, "PNG file to write")->capture_default_str();
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace kiln::cli
