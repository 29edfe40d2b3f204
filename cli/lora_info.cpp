#include "cli/lora_info.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "kiln/core/bytes.h"
#include "kiln/core/error.h"
#include "kiln/io/safetensors.h"
#include "kiln/lora/lora_keys.h"
#include "kiln/pipelines/pipeline_registry.h"

namespace kiln::cli {

namespace {

bool is_number(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// "transformer_blocks.12.attn.to_q" -> "transformer_blocks.*.attn.to_q": one line for a layer of every block.
std::string over_blocks(const std::string& module) {
  std::string out, previous;
  size_t i = 0;
  while (true) {
    const size_t dot = module.find('.', i);
    const std::string part = module.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
    const bool block = is_number(part) && previous.size() >= 6 &&
                       (previous.compare(previous.size() - 6, 6, "blocks") == 0 || previous == "layers");
    out += block ? "*" : part;
    if (dot == std::string::npos) return out;
    out += ".";
    previous = part;
    i = dot + 1;
  }
}

// The family's text-to-image classes, for the reader: "Flux2Pipeline, Flux2KleinPipeline".
std::string pipelines_of(const Family& family) {
  std::string s;
  for (const PipelineClass& c : family.classes)
    if (c.task == Task::TextToImage) s += (s.empty() ? "" : ", ") + c.name;
  return s;
}

std::string counted(const std::map<std::string, int>& counts) {
  std::string s;
  for (const auto& [value, n] : counts) s += (s.empty() ? "" : ", ") + value + " (" + std::to_string(n) + ")";
  return s;
}

int layers_of(const lora::LoraKeys& keys) {
  int n = 0;
  for (const lora::LoraPairKeys& pair : keys.pairs) n += static_cast<int>(pair.targets.size());
  return n;
}

// Ranks, dtypes and alphas, then the layers reached, one line per layer of every block.
void print_layers(const io::SafetensorsFile& file, const lora::LoraKeys& keys) {
  std::map<std::string, std::set<int64_t>> ranks_of;  // "component.pattern" -> ranks
  std::map<std::string, int> count, ranks, dtypes, alphas;
  for (const lora::LoraPairKeys& pair : keys.pairs) {
    const io::TensorInfo& down = file.info(pair.down);
    const int64_t rank = down.shape.empty() ? 0 : down.shape[0];
    ++ranks[std::to_string(rank)];
    ++dtypes[down.stored_dtype];
    if (!pair.alpha.empty()) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", file.tensor(pair.alpha).to(float32).item());
      ++alphas[buf];
    }
    for (const lora::LoraTarget& t : pair.targets) {
      const std::string layer = t.component + "." + over_blocks(t.module);
      ranks_of[layer].insert(rank);
      ++count[layer];
    }
  }
  std::printf("    pairs: %zu; ranks: %s; dtype: %s; alphas: %s\n", keys.pairs.size(), counted(ranks).c_str(),
              counted(dtypes).c_str(), alphas.empty() ? "none (scale 1)" : counted(alphas).c_str());
  for (const auto& [layer, rank_set] : ranks_of) {
    std::string r;
    for (int64_t v : rank_set) r += (r.empty() ? "" : "/") + std::to_string(v);
    std::printf("    %s  x%d, rank %s\n", layer.c_str(), count[layer], r.c_str());
  }
  for (size_t i = 0; i < keys.skipped.size() && i < 5; ++i)
    std::printf("    skipped %s: %s\n", keys.skipped[i].first.c_str(), keys.skipped[i].second.c_str());
  if (keys.skipped.size() > 5) std::printf("    ... and %zu more skipped\n", keys.skipped.size() - 5);
}

}  // namespace

bool print_lora_info(const std::string& path) {
  const io::SafetensorsFile file(path);
  const auto format = lora::detect_lora_format(file.names());
  if (!format) return false;
  std::printf("%s\n  LoRA file, %s layout: %zu tensors, %s\n", path.c_str(), lora::format_name(*format),
              file.names().size(), format_bytes(static_cast<int64_t>(file.file_size())).c_str());
  // What each family makes of the names; the layers are then listed for the family the whole file fits with
  // the most layers.
  std::optional<lora::LoraKeys> best;
  for (const Family& family : families()) {
    if (!family.lora) continue;
    const std::string pipelines = pipelines_of(family);
    lora::LoraKeys keys;
    try {
      keys = lora::plan_lora_keys(file.names(), *family.lora);
    } catch (const Error& e) {
      std::printf("  %s (%s): not loadable: %s\n", family.name.c_str(), pipelines.c_str(), e.what());
      continue;
    }
    std::map<std::string, int> per_component;
    for (const lora::LoraPairKeys& pair : keys.pairs)
      for (const lora::LoraTarget& t : pair.targets) ++per_component[t.component];
    std::string reach;
    for (const auto& [component, n] : per_component)
      reach +=
          (reach.empty() ? "" : ", ") + component + " " + std::to_string(n) + (n == 1 ? " layer" : " layers");
    std::string misfit;
    if (!keys.unknown.empty())
      misfit = "; " + std::to_string(keys.unknown.size()) + " tensor(s) fit no layer, the first '" +
               keys.unknown.front().first + "': " + keys.unknown.front().second;
    std::printf("  %s (%s): %s%s\n", family.name.c_str(), pipelines.c_str(),
                reach.empty() ? "no layers" : reach.c_str(), misfit.c_str());
    if (keys.unknown.empty() && layers_of(keys) > (best ? layers_of(*best) : 0)) best = std::move(keys);
  }
  if (best) print_layers(file, *best);
  return true;
}

}  // namespace kiln::cli
