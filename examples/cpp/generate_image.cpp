// Generates an image with whatever pipeline a model folder holds, through Kiln's public API only:
//   generate_image MODEL_FOLDER "a prompt" OUTPUT.png [steps] [size]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/kiln.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL_FOLDER PROMPT OUTPUT.png [steps] [size]\n", argv[0]);
    return 2;
  }
  try {
    const auto pipe = kiln::DiffusionPipeline::from_pretrained(argv[1]);
    kiln::PipelineRequest request{.prompt = argv[2], .generator = kiln::Generator(0)};
    if (argc > 4) request.num_inference_steps = std::atoi(argv[4]);
    if (argc > 5) request.height = request.width = std::atoll(argv[5]);
    request.callback_on_step_end = [](kiln::StepState& step) {
      std::fprintf(stderr, "step %d of %d\n", step.step + 1, step.num_steps);
    };
    const kiln::PipelineOutput out = (*pipe)(request);
    out.images.at(0).save(argv[3]);
    std::printf("%s: wrote %s (%dx%d)\n", pipe->class_name(), argv[3], out.images[0].width,
                out.images[0].height);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
