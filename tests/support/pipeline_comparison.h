// What the tests comparing whole pipelines share: the call a golden file's metadata records (dumped by the
// reference tools beside diffusers' image), the largest difference between two images in 8-bit levels, and a
// pipeline class's refusal of a request field.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "kiln/io/safetensors.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "support/test_data.h"

namespace kiln::testing {

// One golden file of a pipeline case (tests/data/goldens/<folder>/<case>.safetensors): its tensors, and the
// call's arguments in its metadata, under diffusers' argument names (tools/goldens/edit.py, true_cfg.py,
// prompt_lists.py write them so).
struct GoldenFile {
  io::SafetensorsFile file;
  std::string name;

  GoldenFile(const std::string& folder, const std::string& case_name)
      : file(data_path("goldens/" + folder + "/" + case_name + ".safetensors")), name(case_name) {}
  const std::string& meta(const std::string& key) const { return file.metadata().at(key); }
  bool has(const std::string& key) const { return file.metadata().count(key) > 0; }
  Tensor operator[](const std::string& key) const { return file.tensor(key); }

  // The recorded call: every argument the metadata holds (a prompt recorded as a JSON list is a prompt list;
  // images by name from goldens/flux2/, masks from goldens/edit/); embeddings from the tensors where no
  // prompt text was recorded; the generators from `seeds` (one per image), a recorded torch state, or `seed`.
  PipelineRequest request() const {
    PipelineRequest r;
    // A text argument recorded as one string, or as a JSON list (diffusers' list of prompts).
    const auto text = [&](const char* key, auto& one, std::vector<std::string>& many) {
      if (!has(key)) return;
      if (meta(key).front() == '[')
        many = nlohmann::json::parse(meta(key)).get<std::vector<std::string>>();
      else
        one = meta(key);
    };
    text("prompt", r.prompt, r.prompts);
    text("negative_prompt", r.negative_prompt, r.negative_prompts);
    for (auto [key, field] : {std::pair{"prompt_2", &PipelineRequest::prompt_2},
                              {"negative_prompt_2", &PipelineRequest::negative_prompt_2}})
      if (has(key)) r.*field = meta(key);
    // Embeddings recorded where no text was are the call's (elsewhere they are what the text encodes to).
    for (auto [key, text_key, field] :
         {std::tuple{"prompt_embeds", "prompt", &PipelineRequest::prompt_embeds},
          {"pooled_prompt_embeds", "prompt", &PipelineRequest::pooled_prompt_embeds},
          {"negative_prompt_embeds", "negative_prompt", &PipelineRequest::negative_prompt_embeds},
          {"negative_pooled_prompt_embeds", "negative_prompt",
           &PipelineRequest::negative_pooled_prompt_embeds}})
      if (file.contains(key) && !has(text_key)) r.*field = file.tensor(key);
    if (has("image")) r.image = {Image::load(data_path("goldens/flux2/" + meta("image") + ".png"))};
    if (has("mask_image"))
      r.mask_image = Image::load(data_path("goldens/edit/" + meta("mask_image") + ".png"));
    if (has("strength")) r.strength = std::stod(meta("strength"));
    if (has("padding_mask_crop")) r.padding_mask_crop = std::stoll(meta("padding_mask_crop"));
    if (has("max_area")) r.max_area = std::stoll(meta("max_area"));
    if (has("_auto_resize")) r.auto_resize = meta("_auto_resize") == "True";
    if (has("true_cfg_scale")) r.true_cfg_scale = std::stof(meta("true_cfg_scale"));
    // Z-Image's: cfg_normalization as diffusers takes it (a bool, True meaning 1, or the ratio).
    if (has("cfg_normalization")) {
      const std::string v = meta("cfg_normalization");
      r.cfg_normalization = v == "true" || v == "True"     ? 1.0f
                            : v == "false" || v == "False" ? 0.0f
                                                           : std::stof(v);
    }
    if (has("cfg_truncation")) r.cfg_truncation = std::stof(meta("cfg_truncation"));
    if (has("guidance_scale")) r.guidance_scale = std::stof(meta("guidance_scale"));
    if (has("num_images_per_prompt")) r.num_images_per_prompt = std::stoi(meta("num_images_per_prompt"));
    if (has("height")) r.height = std::stoll(meta("height"));
    if (has("width")) r.width = std::stoll(meta("width"));
    r.num_inference_steps = std::stoi(meta("num_inference_steps"));
    if (has("max_sequence_length")) r.max_sequence_length = std::stoll(meta("max_sequence_length"));
    // The UNet family's: the sampler that ran (tools/goldens/sd.py: the folder's, or one swapped in with
    // from_config; the same class from its own config is itself), its keyword arguments, clip_skip,
    // guidance_rescale, SDXL's micro-conditioning.
    if (has("scheduler")) r.scheduler = meta("scheduler");
    if (has("scheduler_kwargs")) {
      const auto kwargs = nlohmann::json::parse(meta("scheduler_kwargs"));
      if (kwargs.contains("use_karras_sigmas")) r.use_karras_sigmas = kwargs["use_karras_sigmas"].get<bool>();
    }
    if (has("clip_skip")) r.clip_skip = std::stoi(meta("clip_skip"));
    if (has("guidance_rescale")) r.guidance_rescale = std::stof(meta("guidance_rescale"));
    if (has("aesthetic_score")) r.aesthetic_score = std::stof(meta("aesthetic_score"));
    if (has("negative_aesthetic_score"))
      r.negative_aesthetic_score = std::stof(meta("negative_aesthetic_score"));
    for (auto [key, field] :
         {std::pair{"original_size", &PipelineRequest::original_size},
          {"target_size", &PipelineRequest::target_size},
          {"crops_coords_top_left", &PipelineRequest::crops_coords_top_left},
          {"negative_original_size", &PipelineRequest::negative_original_size},
          {"negative_target_size", &PipelineRequest::negative_target_size},
          {"negative_crops_coords_top_left", &PipelineRequest::negative_crops_coords_top_left}})
      if (has(key)) r.*field = nlohmann::json::parse(meta(key)).get<std::vector<int64_t>>();
    if (has("seeds")) {
      for (uint64_t seed : nlohmann::json::parse(meta("seeds")).get<std::vector<uint64_t>>())
        r.generators.emplace_back(seed);
    } else if (file.contains("generator_state")) {
      const std::vector<uint8_t> state = file.tensor("generator_state").to_vector<uint8_t>();
      r.generator = Generator::from_torch_state(state.data(), state.size());
    } else {
      r.generator = Generator(std::stoull(meta("seed")));
    }
    return r;
  }
  // The recorded call without the embeddings a script records beside the prompts (what they encode to,
  // never given in their place: the UNet family's goldens, tools/goldens/sd*.py).
  PipelineRequest text_request() const {
    PipelineRequest r = request();
    r.prompt_embeds = r.pooled_prompt_embeds = r.negative_prompt_embeds = r.negative_pooled_prompt_embeds =
        Tensor();
    return r;
  }
  // The recorded pipeline class on the recorded model folder, in the recorded dtype (float32 when none).
  std::unique_ptr<DiffusionPipeline> load() const {
    const DType dtype = has("dtype") && meta("dtype") == "bfloat16" ? bfloat16 : float32;
    return pipeline_class(meta("pipeline"), name)
        .load(data_path("models/" + meta("model")), {.dtype = dtype});
  }
};

// What a LoRA golden's script did after loading (tools/goldens/lora.py, sd_lora.py, sd_kohya_lora.py write
// it): set_adapters at a weight ("set sd=0.7") or fuse_lora at a scale ("fuse 0.8"), on the adapter named
// "sd".
inline void apply_lora_script(DiffusionPipeline& pipe, const GoldenFile& g) {
  const std::string& script = g.meta("script");
  if (script.find("set sd=") != std::string::npos)
    pipe.set_adapters({"sd"}, {std::stod(script.substr(script.find("set sd=") + 7))});
  if (script.find("fuse ") != std::string::npos)
    pipe.fuse_lora({.lora_scale = std::stod(script.substr(script.find("fuse ") + 5))});
}

// Every image of the call within one 8-bit level of the golden's (diffusers') on at least `share` of its
// values.
inline void expect_images_match(const PipelineOutput& out, const GoldenFile& g, double share = 0.99) {
  const Tensor expected = g["image_u8"];
  ASSERT_EQ(static_cast<int64_t>(out.images.size()), expected.size(0)) << g.name;
  for (size_t b = 0; b < out.images.size(); ++b)
    EXPECT_GE(share_within_one_level(out.images[b].pixels, expected.select(0, static_cast<int64_t>(b))),
              share)
        << g.name << " image " << b;
}

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

// A 32 x 32, 2-step call of "a photo of a cat" with 16 text tokens, for the tiny pipelines.
inline PipelineRequest small_request() {
  PipelineRequest r;
  r.prompt = "a photo of a cat";
  r.height = 32;
  r.width = 32;
  r.num_inference_steps = 2;
  r.max_sequence_length = 16;
  return r;
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
