#include "kiln/io/model_summary.h"

#include <filesystem>

#include "kiln/core/error.h"
#include "kiln/io/checkpoint.h"
#include "kiln/io/component_config.h"
#include "kiln/io/model_index.h"
#include "kiln/quant/storage_type.h"

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

WeightsSummary summarize_weights(const std::string& path) {
  const Checkpoint ckpt(path);
  WeightsSummary w;
  w.path = path;
  w.shards = static_cast<int64_t>(ckpt.shards().size());
  w.tensors = static_cast<int64_t>(ckpt.names().size());
  w.bytes_on_disk = ckpt.bytes_on_disk();
  for (const auto& name : ckpt.names()) {
    const TensorInfo& info = ckpt.info(name);
    const int64_t n = shape_numel(info.shape);
    w.parameters += n;
    w.parameters_by_dtype[info.stored_dtype] += n;
    // An fp8 matrix stays fp8 when it is a Linear weight (nn::CheckpointWeights::load_quantized), as nearly
    // all of them are; every other tensor is held in the dtype the reader gives it.
    const bool kept_fp8 = quant::kept_safetensors_type(info.stored_dtype, info.shape.size()).has_value();
    w.bytes_in_memory += static_cast<uint64_t>(n) * (kept_fp8 ? 1 : dtype_size(info.dtype));
    w.tensor_parameters.emplace_back(name, n);
    if (kept_fp8) w.fp8_matrices.insert(name);
  }
  return w;
}

void add_to(WeightsSummary& total, const WeightsSummary& w) {
  total.shards += w.shards;
  total.tensors += w.tensors;
  total.parameters += w.parameters;
  for (const auto& [d, n] : w.parameters_by_dtype) total.parameters_by_dtype[d] += n;
  total.bytes_on_disk += w.bytes_on_disk;
  total.bytes_in_memory += w.bytes_in_memory;
}

// The class a component folder declares in its own config file, and what kind of folder it is.
void describe_folder(const fs::path& dir, ComponentSummary& c) {
  std::error_code ec;
  if (fs::exists(dir / "config.json", ec)) {
    const auto cfg = load_model_config(dir.string());
    if (c.class_name.empty()) c.class_name = cfg.class_name;
  } else if (fs::exists(dir / "scheduler_config.json", ec)) {
    const auto cfg = load_scheduler_config(dir.string());
    if (c.class_name.empty()) c.class_name = cfg.class_name;
    c.note = "scheduler";
  } else if (fs::exists(dir / "tokenizer_config.json", ec)) {
    const auto cfg = load_tokenizer_config(dir.string());
    if (c.class_name.empty()) c.class_name = cfg.class_name;
    c.note = "tokenizer";
  }
}

ComponentSummary summarize_folder(const fs::path& dir, const std::string& name, const std::string& variant) {
  ComponentSummary c;
  c.name = name;
  c.path = dir.string();
  describe_folder(dir, c);
  const std::string weights = find_checkpoint_if_any(dir.string(), variant);
  if (!weights.empty()) {
    c.has_weights = true;
    c.weights = summarize_weights(weights);
  } else if (!variant.empty() && !find_checkpoint_if_any(dir.string(), "").empty()) {
    find_checkpoint(dir.string(), variant);  // throws: the variant is missing but default weights exist
  }
  return c;
}

bool is_component_folder(const fs::path& dir) {
  std::error_code ec;
  for (const char* f : {"config.json", "scheduler_config.json", "tokenizer_config.json"})
    if (fs::exists(dir / f, ec)) return true;
  return !find_checkpoint_if_any(dir.string()).empty();
}

}  // namespace

ModelSummary summarize_model(const std::string& ref, const ResolveOptions& options,
                             const std::string& variant) {
  ModelSummary s;
  std::error_code ec;
  if (fs::is_regular_file(ref, ec)) {
    const std::string file = fs::path(ref).filename().string();
    KILN_CHECK(
        file.ends_with(".safetensors") || file.ends_with(".json"),
        ref << ": expected a .safetensors file, a .safetensors.index.json, a model folder or a Hugging Face "
               "repo id");
    KILN_CHECK(
        !file.ends_with(".json") || file.find(".index") != std::string::npos,
        ref << ": a JSON file that is not a checkpoint index (*.safetensors.index.json); for a model, pass "
               "its folder");
    s.kind = ModelSummary::Kind::Checkpoint;
    s.source.path = ref;
    ComponentSummary c;
    c.name = file;
    c.path = ref;
    c.has_weights = true;
    c.weights = summarize_weights(ref);
    add_to(s.total, c.weights);
    s.components.push_back(std::move(c));
    return s;
  }
  s.source = resolve_model(ref, options);
  const fs::path dir(s.source.path);
  if (fs::exists(dir / "model_index.json", ec)) {
    s.kind = ModelSummary::Kind::Pipeline;
    const ModelIndex index = load_model_index(dir.string());
    s.class_name = index.class_name;
    for (const auto& pc : index.components) {
      ComponentSummary c;
      if (!pc.present()) {
        c.name = pc.name;
        c.present = false;
        c.note = "null in model_index.json (not part of this pipeline)";
      } else if (!fs::is_directory(dir / pc.name, ec)) {
        c.name = pc.name;
        c.present = false;
        c.note = "folder missing";
      } else {
        c = summarize_folder(dir / pc.name, pc.name, variant);
      }
      c.library = pc.library;
      if (!pc.class_name.empty()) c.class_name = pc.class_name;
      if (c.has_weights) add_to(s.total, c.weights);
      s.components.push_back(std::move(c));
    }
    return s;
  }
  KILN_CHECK(is_component_folder(dir), s.source.path
                                           << ": not a diffusers pipeline or component folder (no "
                                              "model_index.json, config.json, scheduler_config.json, "
                                              "tokenizer_config.json or safetensors weights)");
  s.kind = ModelSummary::Kind::Component;
  ComponentSummary c = summarize_folder(
      dir, dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string(), variant);
  s.class_name = c.class_name;
  if (c.has_weights) add_to(s.total, c.weights);
  s.components.push_back(std::move(c));
  return s;
}

}  // namespace kiln::io
