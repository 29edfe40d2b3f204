#include "cli/generate_args.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/core/signals.h"
#include "kiln/io/output_file.h"

namespace kiln::cli {

void check_generate_args(const GenerateArgs& args) {
  limits::check_prompt_size("--prompt", args.prompt);
  limits::check_prompt_size("--prompt-2", args.prompt_2);
  if (args.negative_prompt) limits::check_prompt_size("--negative-prompt", *args.negative_prompt);
  if (args.height) limits::check_range("--height", *args.height, 1, limits::kMaxImageSide);
  if (args.width) limits::check_range("--width", *args.width, 1, limits::kMaxImageSide);
  if (args.steps) limits::check_range("--steps", *args.steps, 1, limits::kMaxInferenceSteps);
  if (args.guidance)
    KILN_CHECK(std::isfinite(*args.guidance) && *args.guidance >= 0,
               "--guidance: expected a finite value >= 0, got " << *args.guidance);
  if (args.max_sequence_length)
    limits::check_range("--max-sequence-length", *args.max_sequence_length, 1, limits::kMaxSequenceLength);
  check_execution_flags(args.execution);
  // Reference images are decoded once the pipeline is known; a path that cannot be read fails here, before
  // anything is loaded.
  for (const std::string& path : args.images) {
    std::ifstream in(path, std::ios::binary);
    KILN_CHECK(in, "--image " << path << ": cannot be read as a reference image: " << std::strerror(errno));
    std::error_code ec;
    KILN_CHECK(std::filesystem::is_regular_file(path, ec),
               "--image " << path << ": cannot be read as a reference image: not a file");
  }
  try {
    io::check_output_writable(args.output);
  } catch (const Error& e) {
    KILN_FAIL("--output " << e.what());
  }
}

void check_safe_point(const std::string& where) {
  throw_if_stop_requested(where);
  check_mapped_files();
}

}  // namespace kiln::cli
