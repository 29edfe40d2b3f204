// The model families Kiln runs and their pipeline classes, by the class name diffusers writes in
// model_index.json ("_class_name"), as diffusers' DiffusionPipeline.from_pretrained finds them. A family is
// one registered unit (src/families/<family>/, listed once in src/families/registry.cpp): its pipeline
// classes, the request fields each takes, its LoRA layouts and the models of its components. Everything that
// runs pipelines by name (kiln generate, kiln info, kiln serve, the Python package) asks here rather than
// naming a class or a family.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/io/model_summary.h"
#include "kiln/lora/lora_family.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/pipelines/loaded_weights.h"

namespace kiln {

namespace nn {
class Module;
}

// What a pipeline class does with the request's image: the shared stage it composes.
enum class Task {
  TextToImage,   // from noise (where the class takes `image`, the images condition it: FLUX.2's references)
  ImageToImage,  // from `image`, encoded and noised to `strength`
  Inpainting,    // image-to-image, the region outside `mask_image` put back after every step
  Fill,          // the masked image and the mask beside the latents, as the denoiser's extra channels
  ImageEditing,  // the image's latents beside the noise, as context the denoiser reads (Kontext)
};
// "text-to-image", "image-to-image", "inpainting", "fill", "image editing".
const char* task_name(Task task);

struct Family;

struct PipelineClass {
  std::string name;  // "FluxPipeline", as model_index.json names it
  Task task = Task::TextToImage;
  // The request fields it takes (kiln/pipelines/request_fields.h); any other field a request sets is refused.
  std::vector<std::string> fields;
  // The components tensor parallelism can split (PipelineLoadOptions::parallel_config, tensor_parallel).
  std::vector<std::string> splittable_components;
  // The classes whose folders it loads besides its own, as diffusers lets them (FluxImg2ImgPipeline loads a
  // FluxPipeline folder).
  std::vector<std::string> loads_folders_of;
  // How many images an image-editing class reads (0: any number, as Qwen-Image-Edit-2509's); more are
  // refused. And how many it needs (Kontext and FLUX.2 run from text alone; Qwen-Image-Edit edits one): fewer
  // are refused before anything loads.
  size_t max_images = 1;
  size_t min_images = 0;
  std::function<std::unique_ptr<DiffusionPipeline>(const std::string& model,
                                                   const PipelineLoadOptions& options)>
      load;
  // diffusers' from_pipe: this class holding the components of a loaded pipeline of the same folders (a class
  // of its family that loads them); unset for a class that loads its own checkpoint only (Fill, Kontext).
  // Callers go through pipeline_from_pipe, which checks the pair.
  std::function<std::unique_ptr<DiffusionPipeline>(const DiffusionPipeline& pipe)> from_pipe;

  // Filled in by the registry: the family, and its classes that edit this class's folders' images (empty when
  // there is none, or when this class edits an image itself; an image-to-image class has its inpainting one).
  const Family* family = nullptr;
  std::string image_to_image, inpainting;

  bool takes(std::string_view field) const;
  // Whether it starts from request.image (image-to-image, inpainting, Fill) rather than from noise.
  bool edits_an_image() const;
  // The request checks that need no loaded pipeline, so that a caller can refuse a request before loading
  // anything: a field it does not take (one rule, naming the class, the field and the classes that take it),
  // each field's range, and the rules between fields (prompts or prompt lists or embeddings, the generators'
  // count, the images its task needs). RequestError naming the field.
  void check_fields(const PipelineRequest& request) const;
};

// The model of a component, built from its folder without loading weights (kiln info's block positions); null
// for a class the family does not know.
using UnloadedComponent =
    std::function<std::unique_ptr<nn::Module>(const std::string& class_name, const std::string& folder)>;

// A whole pipeline in one file (SD1.x / SDXL finetunes): the class that runs it and the model whose folder
// gives what the file lacks (configs, tokenizers, the scheduler), unless the caller names another.
struct SingleFilePipeline {
  std::string pipeline_class;
  std::string default_config;  // a Hugging Face repo id
};

struct Family {
  std::string name;  // "FLUX.1", in messages
  std::vector<PipelineClass> classes;
  // Where LoRA files go and how their names convert; absent when the family takes none.
  std::optional<lora::LoraFamily> lora;
  UnloadedComponent unloaded_component;
  // What the pipelines read of a component when it is less than its checkpoint holds (FLUX.2's text encoder:
  // the layers its hidden states need); unset or nullopt: every tensor.
  std::function<std::optional<LoadedWeights>(const io::ComponentSummary& component)> partial_weights;
  // Whether a file in an original layout is a whole pipeline of this family: nullopt when the file is none of
  // its kind; throws naming what it is when it is the family's but a kind Kiln does not run. Unset: the
  // family ships no whole-pipeline files.
  std::function<std::optional<SingleFilePipeline>(const std::string& path)> single_file;
};

// Every family, in registration order.
const std::vector<Family>& families();
// Every class of every family, sorted by name.
const std::vector<const PipelineClass*>& pipeline_classes();
// The class named `name`; throws kiln::Error naming `where` (the model_index.json) and the classes Kiln runs
// when it is none of them.
const PipelineClass& pipeline_class(const std::string& name, const std::string& where);
// The class named `name`, or null.
const PipelineClass* find_pipeline_class(std::string_view name);

// The class that starts from an image on `folder`'s folders (`folder`: a loaded folder's class): itself when
// it edits one (image-to-image, inpainting, Fill), but an image-to-image folder's inpainting sibling when a
// mask comes (the SDXL refiner's folder names StableDiffusionXLImg2ImgPipeline); else its inpainting sibling
// when a mask comes with the image, its image-to-image sibling without, as `kiln generate
// --init-image/--mask` picks. Throws RequestError (field "mask_image" with a mask, else "image") naming the
// families whose folders have one, when it has none (Kontext and FLUX.2 take their images as context instead:
// kiln serve gives them the images as `image`).
const PipelineClass& class_for_images(const PipelineClass& folder, bool mask);

// diffusers' from_pipe by class: a pipeline of class `target` holding `pipe`'s components, nothing loaded
// again (kiln serve runs a FluxPipeline folder's image-to-image and inpainting jobs on one copy of its
// weights). Throws kiln::Error naming both classes when `target` does not run `pipe`'s folders.
std::unique_ptr<DiffusionPipeline> pipeline_from_pipe(const PipelineClass& target,
                                                      const DiffusionPipeline& pipe);

// The family and class that run `path` as a whole pipeline (Family::single_file), asking each family in
// turn; throws kiln::Error naming the file when none does (a transformer alone goes beside a folder instead:
// PipelineLoadOptions::transformer_file).
SingleFilePipeline single_file_pipeline(const std::string& path);

}  // namespace kiln
