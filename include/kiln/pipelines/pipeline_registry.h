// The pipeline classes Kiln runs, by the class name diffusers writes in model_index.json ("_class_name"), as
// diffusers' DiffusionPipeline.from_pretrained finds them. Anything that runs pipelines by name (kiln
// generate, a server, bindings) goes through here rather than naming the classes itself.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/pipelines/diffusion_pipeline.h"

namespace kiln {

struct PipelineClass {
  std::string name;  // "FluxPipeline"
  // The components tensor parallelism can split (PipelineLoadOptions::parallel_config, tensor_parallel).
  std::vector<std::string> splittable_components;
  std::unique_ptr<DiffusionPipeline> (*load)(const std::string& model, const PipelineLoadOptions& options);
  // The request checks that need no loaded pipeline: the fields this class does not take (RequestError
  // naming the field), so that a caller can refuse a request before loading anything.
  void (*check_fields)(const PipelineRequest& request);
  // The classes that edit an image with this class's components (they load its folders): image-to-image
  // (image, strength) and inpainting (image, mask_image, strength); empty when there is none.
  std::string image_to_image, inpainting;
  // Whether the class starts from request.image (an editing pipeline) rather than taking references.
  bool edits_an_image = false;
};

// Every class, sorted by name.
const std::vector<PipelineClass>& pipeline_classes();
// The class named `name`; throws kiln::Error naming `where` (the model_index.json) and the classes Kiln runs
// when it is none of them.
const PipelineClass& pipeline_class(const std::string& name, const std::string& where);

}  // namespace kiln
