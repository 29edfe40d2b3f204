// model_index.json: the table of contents of a diffusers pipeline folder. It names the pipeline class and,
// for each component folder, the library and class that load it, e.g.
//   {"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"],
//    "image_encoder": [null, null], ...}
#pragma once

#include <string>
#include <vector>

#include "kiln/io/json_config.h"

namespace kiln::io {

struct PipelineComponent {
  std::string name;        // the folder name: "transformer", "text_encoder_2", ...
  std::string library;     // "diffusers", "transformers"; empty for a null component
  std::string class_name;  // "FluxTransformer2DModel"; empty for a null component
  bool present() const { return !class_name.empty(); }
};

struct ModelIndex {
  std::string path;        // the model_index.json file
  std::string class_name;  // the pipeline: "FluxPipeline", "StableDiffusion3Pipeline", ...
  std::string diffusers_version;
  std::vector<PipelineComponent> components;  // in file order, null components included
  JsonConfig raw;  // everything, including pipeline options such as "force_zeros_for_empty_prompt"

  // The component named `name`, or nullptr.
  const PipelineComponent* find(const std::string& name) const;
};

// Loads `path`, a model_index.json or the pipeline folder holding one. Throws kiln::Error naming the file
// and the key when the pipeline class is missing or a component entry is not [library, class].
ModelIndex load_model_index(const std::string& path);

}  // namespace kiln::io
