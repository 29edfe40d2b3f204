// What a model reference holds, for `kiln info`: the pipeline class, each component with its class, and
// for components with weights the tensor count, parameters per stored dtype, bytes on disk and bytes in
// memory once read (small float formats widen to bfloat16, so they take more memory than disk).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kiln/io/model_ref.h"

namespace kiln::io {

struct WeightsSummary {
  std::string path;  // the .safetensors file or index
  int64_t shards = 0;
  int64_t tensors = 0;
  int64_t parameters = 0;
  std::map<std::string, int64_t> parameters_by_dtype;  // by stored dtype: "BF16" -> count
  uint64_t bytes_on_disk = 0;
  uint64_t bytes_in_memory = 0;  // as loaded: small float formats widened, but fp8 matrices kept in fp8
  std::vector<std::pair<std::string, int64_t>> tensor_parameters;  // (name, parameters), in file order
  std::set<std::string>
      fp8_matrices;  // 2-D tensors stored in fp8, which stay so as Linear weights (1 byte each)
};

struct ComponentSummary {
  std::string name;        // "transformer"; the file or folder name for a lone checkpoint/component
  std::string library;     // from model_index.json: "diffusers", "transformers"; may be empty
  std::string class_name;  // from model_index.json or the component's own config; may be empty
  std::string path;        // the folder (or file); empty when the component is null in model_index.json
  bool present = true;     // false for [null, null] entries and for folders that are missing
  std::string note;        // why a component is absent, or what kind of folder it is
  bool has_weights = false;
  WeightsSummary weights;
};

struct ModelSummary {
  enum class Kind { Pipeline, Component, Checkpoint };
  Kind kind = Kind::Checkpoint;
  ResolvedModel source;
  std::string class_name;  // the pipeline class (Pipeline), the component class (Component), or empty
  std::vector<ComponentSummary> components;
  WeightsSummary total;  // sums over every component with weights
};

// Accepts a .safetensors file, a *.safetensors.index.json, a component folder, a diffusers pipeline folder,
// or a Hugging Face repo id in the local cache. Throws kiln::Error saying what was expected.
ModelSummary summarize_model(const std::string& ref, const ResolveOptions& options = {},
                             const std::string& variant = "");

}  // namespace kiln::io
