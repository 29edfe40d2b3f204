// The LoRA goldens of tools/goldens/lora.py: one diffusers pipeline call each, after a script of LoRA calls
// kept in the file's metadata ("load FILE NAME; set NAME=W,NAME=W; fuse SCALE; unfuse"), which replay() runs
// on a Kiln pipeline.
#pragma once

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/io/safetensors.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "support/test_data.h"

namespace kiln::testing {

struct LoraGolden {
  io::SafetensorsFile file;
  std::string pipeline, script, transformer_file;
  DType dtype = float32;
  PipelineRequest call;

  explicit LoraGolden(const std::string& name) : file(data_path("goldens/lora/" + name + ".safetensors")) {
    const auto& m = file.metadata();
    pipeline = m.at("pipeline");
    script = m.at("script");
    transformer_file = m.at("transformer_file");
    dtype = m.at("dtype") == "bfloat16" ? bfloat16 : float32;
    call.prompt = m.at("prompt");
    if (m.count("negative_prompt") && !m.at("negative_prompt").empty())
      call.negative_prompt = m.at("negative_prompt");
    call.height = std::stoll(m.at("height"));
    call.width = std::stoll(m.at("width"));
    call.num_inference_steps = std::stoi(m.at("steps"));
    call.guidance_scale = std::stof(m.at("guidance"));
    call.max_sequence_length = std::stoll(m.at("max_sequence_length"));
  }

  PipelineRequest request() const {
    PipelineRequest r = call;
    r.generator = Generator(std::stoull(file.metadata().at("seed")));
    return r;
  }

  // The golden's pipeline (`options` for what else it is loaded with: tensor parallelism).
  std::unique_ptr<DiffusionPipeline> load(PipelineLoadOptions options = {}) const {
    options.dtype = dtype;
    if (!transformer_file.empty()) options.transformer_file = data_path("gguf/" + transformer_file);
    return DiffusionPipeline::from_pretrained(data_path("models/" + pipeline), options);
  }

  // Runs the script's LoRA calls on `pipe` (files from tests/data/lora).
  void replay(DiffusionPipeline& pipe) const {
    std::stringstream steps(script);
    for (std::string step; std::getline(steps, step, ';');) {
      std::stringstream words(step);
      std::string verb, arg, name;
      words >> verb >> arg >> name;
      if (verb.empty()) continue;
      if (verb == "load") {
        pipe.load_lora_weights(data_path("lora/" + arg), {.adapter_name = name});
      } else if (verb == "set") {
        std::vector<std::string> names;
        std::vector<double> weights;
        std::stringstream pairs(arg);
        for (std::string pair; std::getline(pairs, pair, ',');) {
          names.push_back(pair.substr(0, pair.find('=')));
          weights.push_back(std::stod(pair.substr(pair.find('=') + 1)));
        }
        pipe.set_adapters(names, weights);
      } else if (verb == "fuse") {
        pipe.fuse_lora({.lora_scale = std::stod(arg)});
      } else if (verb == "unfuse") {
        pipe.unfuse_lora();
      } else {
        ADD_FAILURE() << "unknown step in the golden's script: " << step;
      }
    }
  }

  const Tensor image() const { return file.tensor("image_u8"); }
};

}  // namespace kiln::testing
