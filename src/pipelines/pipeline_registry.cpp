#include "kiln/pipelines/pipeline_registry.h"

#include "kiln/pipelines/flux2_pipeline.h"
#include "kiln/pipelines/flux_pipeline.h"
#include "kiln/pipelines/sd3_pipeline.h"

namespace kiln {

namespace {

template <class Pipeline>
std::unique_ptr<DiffusionPipeline> load(const std::string& model, const PipelineLoadOptions& options) {
  return std::make_unique<Pipeline>(Pipeline::from_pretrained(model, options));
}

template <class Pipeline>
PipelineClass entry(const char* name) {
  return {name, Pipeline::splittable_components(), load<Pipeline>, Pipeline::check_fields};
}

}  // namespace

const std::vector<PipelineClass>& pipeline_classes() {
  static const std::vector<PipelineClass> classes = {
      entry<Flux2KleinPipeline>("Flux2KleinPipeline"),
      entry<Flux2Pipeline>("Flux2Pipeline"),
      entry<FluxFillPipeline>("FluxFillPipeline"),
      entry<FluxImg2ImgPipeline>("FluxImg2ImgPipeline"),
      entry<FluxInpaintPipeline>("FluxInpaintPipeline"),
      entry<FluxPipeline>("FluxPipeline"),
      entry<StableDiffusion3Img2ImgPipeline>("StableDiffusion3Img2ImgPipeline"),
      entry<StableDiffusion3InpaintPipeline>("StableDiffusion3InpaintPipeline"),
      entry<StableDiffusion3Pipeline>("StableDiffusion3Pipeline"),
  };
  return classes;
}

const PipelineClass& pipeline_class(const std::string& name, const std::string& where) {
  std::string known;
  for (const PipelineClass& c : pipeline_classes()) {
    if (c.name == name) return c;
    known += (known.empty() ? "" : ", ") + c.name;
  }
  KILN_FAIL(where << ": pipeline class '" << name << "' is not supported (Kiln runs " << known << ")");
}

}  // namespace kiln
