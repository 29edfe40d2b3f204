// The LoRA key converters (kiln/lora/lora_keys.h): the input's first byte picks the model family (among the
// registered families that take LoRA, in registration order), the rest is a list of tensor names, one per line, as a LoRA file's header would list them.
// The layout is detected and the names converted; every pair found must name two of the input's tensors and
// at least one layer, and everything unknown or skipped must be an input name.
#include <set>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "kiln/lora/lora_keys.h"
#include "kiln/pipelines/pipeline_registry.h"

using namespace kiln;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::make_runtime_deterministic();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::vector<const lora::LoraFamily*> taking_lora = [] {
    std::vector<const lora::LoraFamily*> out;
    for (const Family& f : families())
      if (f.lora) out.push_back(&*f.lora);
    return out;
  }();
  const lora::LoraFamily& family = *taking_lora[data[0] % taking_lora.size()];
  std::vector<std::string> names;
  for (std::string_view n : fuzz::split({reinterpret_cast<const char*>(data) + 1, size - 1}, "\n", 4096))
    names.emplace_back(n);
  const std::set<std::string> given(names.begin(), names.end());
  lora::detect_lora_format(names, &family);
  fuzz::expect_clean([&] {
    const lora::LoraKeys keys = lora::plan_lora_keys(names, family);
    for (const lora::LoraPairKeys& pair : keys.pairs) {
      fuzz::require(given.count(pair.down) && given.count(pair.up) && pair.down != pair.up,
                    "a pair whose tensors are not two of the file's");
      fuzz::require(pair.alpha.empty() || given.count(pair.alpha), "an alpha that is not the file's");
      fuzz::require(!pair.targets.empty(), "a pair that reaches no layer");
      for (const lora::LoraTarget& t : pair.targets)
        fuzz::require(!t.component.empty() && !t.module.empty(), "a layer without a component or a module");
    }
    for (const auto& [name, why] : keys.unknown)
      fuzz::require(given.count(name) && !why.empty(), "bad unknown entry");
    for (const auto& [name, why] : keys.skipped)
      fuzz::require(given.count(name) && !why.empty(), "bad skipped entry");
  });
  return 0;
}
