// What the family descriptors (src/families/<name>/family.cpp) share: the request fields every pipeline class
// takes, a class's load function from its type, and field lists put together.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "kiln/models/decoder_text_encoder.h"
#include "kiln/pipelines/pipeline_registry.h"

namespace kiln {

// The fields of every class: the size, the schedule, guidance, the generator, the text encoder's tokens, how
// many images and what the call returns.
inline const std::vector<std::string>& common_request_fields() {
  static const std::vector<std::string> fields = {"height",
                                                  "width",
                                                  "num_inference_steps",
                                                  "guidance_scale",
                                                  "generator",
                                                  "max_sequence_length",
                                                  "num_images_per_prompt",
                                                  "output_type"};
  return fields;
}

// The concatenation of field lists.
inline std::vector<std::string> joined_fields(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

// The models of the components several families share (AutoencoderKL, T5EncoderModel, the CLIP text models,
// the decoder-only text encoders: Mistral 3, Qwen3), built from their folders without weights, as a family's
// unloaded_component builds its own; null for any other class.
std::unique_ptr<nn::Module> shared_unloaded_component(const std::string& class_name,
                                                      const std::string& folder);

// What a pipeline reads of a decoder-only text encoder component (Mistral 3, Qwen3): the embedding and the
// layers that the hidden states `indices_of(config)` need (0 = the embedding, L = the final norm), for
// Family::partial_weights; nullopt for any other component.
std::optional<LoadedWeights> decoder_text_encoder_weights(
    const io::ComponentSummary& component,
    const std::function<std::vector<int64_t>(const models::DecoderTextEncoderConfig&)>& indices_of);

// Before a family loads its transformer from a single file (PipelineLoadOptions::transformer_file): refused
// under tensor parallelism, naming `pipeline_class`; returns the folder's transformer/config.json when it has
// one, else
// "" (the file's shapes say what it is).
std::string single_file_transformer_config(const std::string& folder, const PipelineLoadOptions& options,
                                           const char* pipeline_class);

// `Pipeline::from_pretrained` as a PipelineClass's load function.
template <class Pipeline>
std::unique_ptr<DiffusionPipeline> load_pipeline(const std::string& model,
                                                 const PipelineLoadOptions& options) {
  return std::make_unique<Pipeline>(Pipeline::from_pretrained(model, options));
}

// `Pipeline::from_pipe` (taking a `Base`) as a PipelineClass's from_pipe function; the registry's
// pipeline_from_pipe checks that `pipe` is a class of the same folders before it calls this.
template <class Pipeline, class Base>
std::unique_ptr<DiffusionPipeline> pipe_from(const DiffusionPipeline& pipe) {
  const auto* base = dynamic_cast<const Base*>(&pipe);
  KILN_CHECK(base != nullptr, "internal: " << pipe.class_name() << " is not a " << typeid(Base).name());
  return std::make_unique<Pipeline>(Pipeline::from_pipe(*base));
}

}  // namespace kiln
