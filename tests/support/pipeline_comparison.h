// What the tests comparing whole pipelines share: the call a golden file's metadata records (dumped by the
// reference tools beside diffusers' image), the largest difference between two images in 8-bit levels, and a
// pipeline class's refusal of a request field.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kiln/io/safetensors.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "support/test_data.h"

namespace kiln::testing {

// One golden file of a pipeline case (tests/data/goldens/<folder>/<case>.safetensors): its tensors, and the
// call's arguments in its metadata.
struct GoldenFile {
  io::SafetensorsFile file;
  std::string name;

  GoldenFile(const std::string& folder, const std::string& case_name)
      : file(data_path("goldens/" + folder + "/" + case_name + ".safetensors")), name(case_name) {}
  const std::string& meta(const std::string& key) const { return file.metadata().at(key); }
  bool has(const std::string& key) const { return file.metadata().count(key) > 0; }
  Tensor operator[](const std::string& key) const { return file.tensor(key); }
};

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

// The same against a uint8 reference tensor (a golden's image_u8).
inline int max_level_difference(const Image& image, const Tensor& expected_u8) {
  const std::vector<uint8_t> want = expected_u8.contiguous().to_vector<uint8_t>();
  EXPECT_EQ(image.pixels.size(), want.size());
  int m = 0;
  for (size_t i = 0; i < want.size() && i < image.pixels.size(); ++i)
    m = std::max(m, std::abs(static_cast<int>(image.pixels[i]) - static_cast<int>(want[i])));
  return m;
}

// `pipeline`'s field check (pipeline_class(...).check_fields) refuses `r` naming `field`, its message saying
// `words`.
inline void expect_refused(const std::string& pipeline, const PipelineRequest& r, const std::string& field,
                           const std::string& words) {
  try {
    pipeline_class(pipeline, "").check_fields(r);
    ADD_FAILURE() << pipeline << " took the request (expected " << field << " refused)";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

}  // namespace kiln::testing
