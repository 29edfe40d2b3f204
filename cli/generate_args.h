// The flags of `kiln generate`, and the checks made on them before any work: every size against its named
// limit (kiln/core/limits.h), the byte budgets parsed, the output path writable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/execution_flags.h"
#include "cli/request_flags.h"

namespace kiln::cli {

// Where image i of n goes: `output` itself for one image, else its stem with "-i" before the extension
// ("out.png" -> "out-0.png", "out-1.png", ...).
std::string output_path(const std::string& output, int image, int num_images);

struct GenerateArgs {
  std::string model;
  // A single-file transformer (original layout as .safetensors, or .gguf) replacing the model's.
  std::string transformer;
  // With a whole-pipeline single file as the model (an SD1.x / SDXL finetune): the folder or repo id whose
  // configs, tokenizers and scheduler it takes (empty: the family's base model).
  std::string config;
  RequestFlags request;  // the request's fields (cli/request_flags.h): --prompt, --steps, ...
  std::optional<std::string> init_image;  // image-to-image, inpainting, Fill: the image to start from
  // SDXL's hand-off in latents: a .safetensors of latents to start from instead of --init-image (the
  // refiner's side, with --denoising-start), and where the call's latents go instead of a PNG (the base's
  // side, with --denoising-end).
  std::optional<std::string> init_latents, output_latents;
  // Both sides in one process: the base (--model) runs to --denoising-end, then this refiner from its
  // latents at the same fraction, each with a fresh generator of the same seed (diffusers' example).
  std::string refiner;
  std::string output = "output.png";  // OUTPUT-0.png, OUTPUT-1.png, ... for several images
  ExecutionFlags execution;        // dtype, mode, offload, memory, VAE tiling, --tp (shared with kiln serve)
  std::vector<std::string> loras;  // --lora FILE[:SCALE], in order
  bool fuse_lora = false;          // --fuse-lora
  bool lora_skip_mismatches = false;  // --lora-skip-mismatches
};

// One --lora value: the file and its adapter weight, "style.safetensors:0.8" (1 without ":SCALE"; a suffix
// after the last ':' that is not a number belongs to the path). Throws naming the flag for a weight that is
// not finite.
struct LoraFlag {
  std::string path;
  double scale = 1.0;
};
LoraFlag parse_lora_flag(const std::string& value);

// Throws kiln::Error naming the flag and its limit ("--height 1000000 exceeds the maximum 16384"), a --image
// that is not a readable file, or why the output cannot be written; the pipelines check the rest (multiples
// of the VAE's scale, ...) once loaded. Returns the request the flags describe (request_from_flags).
PipelineRequest check_generate_args(const GenerateArgs& args);

// The latents of an --init-latents file: its "latents" tensor (or its one tensor), [B, C, h, w] of a
// floating-point dtype; throws kiln::Error naming the flag, the file and what it holds otherwise.
Tensor read_init_latents(const std::string& path);

// Between components while loading and between denoising steps: throws when SIGINT/SIGTERM asked for a stop
// or a mapped checkpoint changed on disk (kiln/core/signals.h); `where` says how far the run got.
void check_safe_point(const std::string& where);

}  // namespace kiln::cli
