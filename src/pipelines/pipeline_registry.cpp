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
PipelineClass entry(const char* name, std::string image_to_image = "", std::string inpainting = "",
                    bool edits_an_image = false) {
  return {name,           Pipeline::splittable_components(),
          load<Pipeline>, Pipeline::check_fields,
          image_to_image, inpainting,
          edits_an_image};
}

}  // namespace

const std::vector<PipelineClass>& pipeline_classes() {
  static const std::vector<PipelineClass> classes = {
      entry<Flux2KleinPipeline>("Flux2KleinPipeline"),
      entry<Flux2Pipeline>("Flux2Pipeline"),
      entry<FluxFillPipeline>("FluxFillPipeline", "", "FluxFillPipeline", true),
      entry<FluxImg2ImgPipeline>("FluxImg2ImgPipeline", "FluxImg2ImgPipeline", "FluxInpaintPipeline", true),
      entry<FluxInpaintPipeline>("FluxInpaintPipeline", "FluxImg2ImgPipeline", "FluxInpaintPipeline", true),
      entry<FluxKontextPipeline>("FluxKontextPipeline", "FluxImg2ImgPipeline", "FluxInpaintPipeline"),
      entry<FluxPipeline>("FluxPipeline", "FluxImg2ImgPipeline", "FluxInpaintPipeline"),
      entry<StableDiffusion3Img2ImgPipeline>("StableDiffusion3Img2ImgPipeline",
                                             "StableDiffusion3Img2ImgPipeline",
                                             "StableDiffusion3InpaintPipeline", true),
      entry<StableDiffusion3InpaintPipeline>("StableDiffusion3InpaintPipeline",
                                             "StableDiffusion3Img2ImgPipeline",
                                             "StableDiffusion3InpaintPipeline", true),
      entry<StableDiffusion3Pipeline>("StableDiffusion3Pipeline", "StableDiffusion3Img2ImgPipeline",
                                      "StableDiffusion3InpaintPipeline"),
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
