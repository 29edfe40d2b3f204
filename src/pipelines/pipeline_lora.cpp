// DiffusionPipeline's LoRA calls (kiln/pipelines/diffusion_pipeline.h): each takes its turn among the
// pipeline's calls and runs in the pipeline's execution context, where the adapters' tensors are made.
#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "pipelines/call_control.h"

namespace kiln {

lora::LoraAdapters& DiffusionPipeline::lora_adapters() {
  std::unique_ptr<lora::LoraAdapters>& lora = shared_->lora;
  if (!lora) {
    const Family& family = *pipeline_class(class_name(), "").family;
    KILN_CHECK(family.lora, class_name() << " does not take LoRA adapters (the " << family.name
                                         << " pipelines take none)");
    lora = std::make_unique<lora::LoraAdapters>(lora_family(*family.lora), class_name(), components());
  }
  return *lora;
}

lora::LoraLoadReport DiffusionPipeline::load_lora_weights(const std::string& path,
                                                          const lora::LoraLoadOptions& options) {
  const auto turn = shared_->calls.wait_turn();
  ExecutionScope in(*context_);
  return lora_adapters().load(path, options);
}

void DiffusionPipeline::set_adapters(const std::vector<std::string>& adapter_names,
                                     const std::vector<double>& adapter_weights) {
  const auto turn = shared_->calls.wait_turn();
  ExecutionScope in(*context_);
  lora_adapters().set_adapters(adapter_names, adapter_weights);
}

void DiffusionPipeline::fuse_lora(const lora::FuseLoraOptions& options) {
  const auto turn = shared_->calls.wait_turn();
  ExecutionScope in(*context_);
  lora_adapters().fuse(options);
}

void DiffusionPipeline::unfuse_lora() {
  const auto turn = shared_->calls.wait_turn();
  ExecutionScope in(*context_);
  lora_adapters().unfuse();
}

void DiffusionPipeline::unload_lora_weights() {
  const auto turn = shared_->calls.wait_turn();
  ExecutionScope in(*context_);
  lora_adapters().unload();
}

void DiffusionPipeline::delete_adapters(const std::vector<std::string>& adapter_names) {
  const auto turn = shared_->calls.wait_turn();
  ExecutionScope in(*context_);
  lora_adapters().delete_adapters(adapter_names);
}

std::vector<std::string> DiffusionPipeline::get_active_adapters() const {
  return shared_->lora ? shared_->lora->active_adapters() : std::vector<std::string>{};
}

std::map<std::string, std::vector<std::string>> DiffusionPipeline::get_list_adapters() const {
  return shared_->lora ? shared_->lora->list_adapters() : std::map<std::string, std::vector<std::string>>{};
}

}  // namespace kiln
