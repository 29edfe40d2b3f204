// What the tests comparing whole pipelines share: the call a golden file's metadata records (dumped by the
// reference tools beside diffusers' image), and the largest difference between two images in 8-bit levels.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kiln/io/safetensors.h"
#include "kiln/pipelines/diffusion_pipeline.h"

namespace kiln::testing {

// prompt, negative_prompt (when recorded), height, width, steps, guidance, seed, max_sequence_length.
inline PipelineRequest request_from_golden(const io::SafetensorsFile& g) {
  const auto& m = g.metadata();
  PipelineRequest c;
  c.prompt = m.at("prompt");
  if (m.count("negative_prompt")) c.negative_prompt = m.at("negative_prompt");
  c.height = std::stoll(m.at("height"));
  c.width = std::stoll(m.at("width"));
  c.num_inference_steps = std::stoi(m.at("steps"));
  c.guidance_scale = std::stof(m.at("guidance"));
  c.generator = Generator(std::stoull(m.at("seed")));
  c.max_sequence_length = std::stoll(m.at("max_sequence_length"));
  return c;
}

// The largest per-channel difference; a size mismatch fails the test.
inline int max_level_difference(const Image& a, const Image& b) {
  EXPECT_EQ(a.pixels.size(), b.pixels.size());
  int m = 0;
  for (size_t i = 0; i < a.pixels.size() && i < b.pixels.size(); ++i)
    m = std::max(m, std::abs(static_cast<int>(a.pixels[i]) - static_cast<int>(b.pixels[i])));
  return m;
}

}  // namespace kiln::testing
