#include "cli/generate_args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "kiln/core/error.h"
#include "kiln/core/signals.h"
#include "kiln/io/output_file.h"
#include "kiln/io/safetensors.h"

namespace kiln::cli {

PipelineRequest check_generate_args(const GenerateArgs& args) {
  const PipelineRequest request = request_from_flags(args.request);
  check_execution_flags(args.execution);
  // Images are decoded once the pipeline is known; a path that cannot be read fails here, before anything is
  // loaded.
  const auto readable = [](const char* flag, const std::string& path, const char* what) {
    std::ifstream in(path, std::ios::binary);
    KILN_CHECK(in, flag << " " << path << ": cannot be read as " << what << ": " << std::strerror(errno));
    std::error_code ec;
    KILN_CHECK(std::filesystem::is_regular_file(path, ec),
               flag << " " << path << ": cannot be read as " << what << ": not a file");
  };
  for (const std::string& path : image_paths(args.request, "image"))
    readable("--image", path, "a reference image");
  if (args.init_image) readable("--init-image", *args.init_image, "the initial image");
  for (const std::string& path : image_paths(args.request, "mask_image")) readable("--mask", path, "a mask");
  // --init-image (or --init-latents) picks the folder's image-to-image or inpainting class; the flags of that
  // task need it.
  KILN_CHECK(!(args.init_image && args.init_latents),
             "--init-latents start from latents instead of --init-image: give one or the other");
  const bool init = args.init_image || args.init_latents;
  const bool mask = args.request.given("mask_image");
  KILN_CHECK(!mask || init, "--mask marks what to repaint in --init-image; give --init-image too");
  KILN_CHECK(!args.request.given("strength") || init,
             "--strength says how much of --init-image is redrawn; give --init-image too");
  KILN_CHECK(!args.request.given("denoising_start") || init || !args.refiner.empty(),
             "--denoising-start starts from the latents of a base stopped at --denoising-end: give "
             "--init-latents (a base's --output-latents file)");
  if (!args.refiner.empty()) {
    KILN_CHECK(
        args.request.given("denoising_end"),
        "--refiner " << args.refiner
                     << " takes the base's latents at --denoising-end: give --denoising-end (diffusers' "
                        "example: 0.8)");
    KILN_CHECK(
        !args.request.given("denoising_start"),
        "--denoising-start: with --refiner the refiner starts where the base stops, at --denoising-end");
    KILN_CHECK(
        !args.output_latents && !args.init_latents,
        "--refiner runs both sides of the hand-off in one process; --output-latents and --init-latents "
        "are for running them apart");
  }
  PipelineRequest checked = request;
  if (args.init_latents) checked.image_latents = read_init_latents(*args.init_latents);
  KILN_CHECK(!args.request.given("padding_mask_crop") || mask,
             "--padding-mask-crop crops around --mask; give --init-image and --mask too");
  // LoRA files: readable, each weight a finite number; the LoRA-only flags need one.
  for (const std::string& value : args.loras) {
    const LoraFlag lora = parse_lora_flag(value);
    std::ifstream in(lora.path, std::ios::binary);
    KILN_CHECK(in, "--lora " << value << ": cannot read " << lora.path << ": " << std::strerror(errno)
                             << " (expected FILE[:SCALE], e.g. style.safetensors:0.8)");
    std::error_code ec;
    KILN_CHECK(std::filesystem::is_regular_file(lora.path, ec),
               "--lora " << value << ": " << lora.path << " is not a file");
  }
  KILN_CHECK(!args.fuse_lora || !args.loras.empty(), "--fuse-lora fuses the adapters of --lora; give one");
  KILN_CHECK(!args.lora_skip_mismatches || !args.loras.empty(),
             "--lora-skip-mismatches applies to the files of --lora; give one");
  if (args.output_latents) {
    try {
      io::check_output_writable(*args.output_latents);
    } catch (const Error& e) {
      KILN_FAIL("--output-latents " << e.what());
    }
    return checked;  // no PNG is written
  }
  const int images = request.num_images_per_prompt;
  for (int i = 0; i < images; ++i) {
    const std::string path = output_path(args.output, i, images);
    try {
      io::check_output_writable(path);
    } catch (const Error& e) {
      KILN_FAIL("--output " << e.what());
    }
  }
  return checked;
}

Tensor read_init_latents(const std::string& path) {
  std::unique_ptr<io::SafetensorsFile> file;
  try {
    file = std::make_unique<io::SafetensorsFile>(path);
  } catch (const Error& e) {
    KILN_FAIL("--init-latents " << path << ": cannot be read as latents (a .safetensors file, as "
                                << "--output-latents writes): " << e.what());
  }
  const std::vector<std::string>& names = file->names();
  const bool named = std::find(names.begin(), names.end(), "latents") != names.end();
  KILN_CHECK(named || names.size() == 1, "--init-latents " << path << ": no tensor \"latents\" (and "
                                                           << names.size()
                                                           << " tensors, not one): give the file "
                                                              "--output-latents wrote");
  const Tensor latents = file->tensor(named ? "latents" : names.front());
  KILN_CHECK(latents.dim() == 4 && is_floating(latents.dtype()) && latents.numel() > 0,
             "--init-latents " << path << ": the latents must be a floating-point array [batch, channels, "
                               << "height / scale, width / scale], got " << latents.str());
  return latents.to(float32).clone();  // its own memory, not a view of the file's mapping
}

std::string output_path(const std::string& output, int image, int num_images) {
  if (num_images == 1) return output;
  const std::filesystem::path p(output);
  const std::string stem = p.stem().string() + "-" + std::to_string(image) + p.extension().string();
  return (p.parent_path() / stem).string();
}

LoraFlag parse_lora_flag(const std::string& value) {
  const size_t colon = value.rfind(':');
  if (colon == std::string::npos || colon + 1 == value.size()) return {value, 1.0};
  const std::string tail = value.substr(colon + 1);
  char* end = nullptr;
  errno = 0;
  const double scale = std::strtod(tail.c_str(), &end);
  if (end != tail.c_str() + tail.size()) return {value, 1.0};  // not a number: part of the path
  KILN_CHECK(std::isfinite(scale) && errno != ERANGE,
             "--lora " << value << ": the adapter weight after ':' must be a finite number, got " << tail);
  return {value.substr(0, colon), scale};
}

void check_safe_point(const std::string& where) {
  throw_if_stop_requested(where);
  check_mapped_files();
}

}  // namespace kiln::cli
