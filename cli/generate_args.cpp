#include "cli/generate_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/core/error.h"
#include "kiln/core/signals.h"
#include "kiln/io/output_file.h"

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
  for (const std::string& path : image_paths(args.request, "image")) readable("--image", path, "a reference image");
  if (args.init_image) readable("--init-image", *args.init_image, "the initial image");
  for (const std::string& path : image_paths(args.request, "mask_image")) readable("--mask", path, "a mask");
  // --init-image picks the folder's image-to-image or inpainting class; the flags of that task need it.
  const bool mask = args.request.given("mask_image");
  KILN_CHECK(!mask || args.init_image, "--mask marks what to repaint in --init-image; give --init-image too");
  KILN_CHECK(!args.request.given("strength") || args.init_image,
             "--strength says how much of --init-image is redrawn; give --init-image too");
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
  const int images = request.num_images_per_prompt;
  for (int i = 0; i < images; ++i) {
    const std::string path = output_path(args.output, i, images);
    try {
      io::check_output_writable(path);
    } catch (const Error& e) {
      KILN_FAIL("--output " << e.what());
    }
  }
  return request;
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
