// Module::to: moving a module's weights between devices (kiln/nn/module.h).
#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "kiln/nn/module.h"
#include "kiln/quant/storage_type.h"

namespace kiln::nn {

// fp8 weights hold bfloat16 values in a narrower format: where no kernel reads fp8 (off the CPU) they are
// widened to the layer's compute dtype, the values a widening load would have given. Block-quantized GGUF
// weights are not: expanding them would silently multiply the device memory they were chosen to save.
void Module::widen_fp8_weights_for(Device device) {
  if (device.type == DeviceType::CPU) return;
  std::vector<std::pair<std::string, const Parameter*>> all;
  collect("", all);
  for (const auto& [name, p] : all) {
    if (p->quantized == nullptr || !quant::is_fp8(p->quantized->type) || !p->slot->defined()) continue;
    *p->slot = quant::QuantizedTensor{*p->slot, p->quantized->type, p->shape}.dequantize().to(
        p->quantized->compute_dtype);
    p->quantized->type = quant::StorageType::F32;
  }
}

void Module::check_movable_to(Device device) const {
  if (device.type == DeviceType::CPU) return;
  std::vector<std::pair<std::string, const Parameter*>> all;
  collect("", all);
  for (const auto& [name, p] : all)
    KILN_CHECK(
        p->quantized == nullptr || !p->quantized->is_quantized() || quant::is_fp8(p->quantized->type) ||
            !p->slot->defined(),
        type_name() << ".to(" << device.str() << "): parameter '" << name << "' is kept block-quantized ("
                    << quant::traits(p->quantized->type).name
                    << "), which only the cpu's kernels read; load the model dequantized (a float dtype, "
                       "keep_quantized = false) to run it on "
                    << device.str());
}

void Module::to(Device device) {
  // Checked first, so that a refused call leaves the whole module where it was.
  check_movable_to(device);
  widen_fp8_weights_for(device);
  std::vector<std::pair<std::string, const Parameter*>> all;
  collect("", all);
  for (const auto& [name, p] : all)
    if (p->slot->defined()) *p->slot = p->slot->to(device);
  move_runtime_inputs(device);
}

void Module::offload_to(Device device) {
  check_movable_to(device);
  widen_fp8_weights_for(device);
  WeightTier& tier = device_runtime(device).weight_tier();
  std::vector<std::pair<std::string, const Parameter*>> all;
  collect("", all);
  for (const auto& [name, p] : all) {
    Tensor& slot = *p->slot;
    if (!slot.defined() || (slot.device() == device && slot.storage()->is_host_backed())) continue;
    slot = tier.offloaded(slot.device().type == DeviceType::CPU ? slot : slot.to(cpu));
  }
  move_runtime_inputs(device);
}

void Module::move_runtime_inputs(Device device) {
  for (Tensor* slot : runtime_inputs_)
    if (slot->defined()) *slot = slot->to(device);
  for (const auto& [name, child] : children_) child->move_runtime_inputs(device);
}

const Tensor* Module::first_defined_parameter() const {
  for (const Parameter& p : parameters_)
    if (p.slot->defined()) return p.slot;
  for (const auto& [name, child] : children_)
    if (const Tensor* found = child->first_defined_parameter()) return found;
  return nullptr;
}

// Without building the parameters' names: the pipelines ask once per stage.
Device Module::device() const {
  const Tensor* first = first_defined_parameter();
  return first != nullptr ? first->device() : cpu;
}

Tensor Module::on_weights_device(const Tensor& x) const {
  return x.defined() ? x.to(device()) : x;
}

}  // namespace kiln::nn
