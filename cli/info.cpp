// `kiln info MODEL`: what a checkpoint file, component folder, pipeline folder or cached repo holds.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "cli/device_info.h"
#include "cli/gguf_info.h"
#include "cli/lora_info.h"
#include "kiln/core/bytes.h"
#include "kiln/core/device.h"
#include "kiln/core/limits.h"
#include "kiln/io/model_summary.h"
#include "kiln/pipelines/component_blocks.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/pipelines/loaded_weights.h"
#include "kiln/pipelines/offload.h"
#include "kiln/pipelines/weight_packing.h"

namespace kiln::cli {

namespace {

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string dtype_list(const std::map<std::string, int64_t>& by_dtype, bool with_counts) {
  std::string s;
  for (const auto& [dtype, n] : by_dtype) {
    if (!s.empty()) s += ", ";
    s += with_counts ? dtype + " " + with_commas(n) : dtype;
  }
  return s.empty() ? "-" : s;
}

void print_weights(const io::WeightsSummary& w, const char* indent) {
  std::printf("%sweights: %s%s\n", indent, w.path.c_str(),
              w.shards > 1 ? (" (" + std::to_string(w.shards) + " shards)").c_str() : "");
  std::printf("%s  %s parameters in %s tensors; dtype %s\n", indent, with_commas(w.parameters).c_str(),
              with_commas(w.tensors).c_str(),
              dtype_list(w.parameters_by_dtype, w.parameters_by_dtype.size() > 1).c_str());
  std::printf("%s  %s on disk, %s in memory\n", indent, format_bytes(w.bytes_on_disk).c_str(),
              format_bytes(w.bytes_in_memory).c_str());
}

// What a tensor of `component` that kiln generate reads takes in memory in bf16: 2 bytes per parameter, 1 for
// an fp8 matrix (it stays fp8 as a Linear weight).
int64_t bf16_bytes(const io::ComponentSummary& component, const std::string& name, int64_t parameters) {
  return component.weights.fp8_matrices.count(name) != 0 ? parameters : 2 * parameters;
}

void print_summary(const std::string& ref, const io::ModelSummary& s) {
  std::printf("%s\n", ref.c_str());
  if (s.source.from_cache())
    std::printf("  from the Hugging Face cache: %s@%s (commit %s)\n  folder: %s\n", s.source.repo_id.c_str(),
                s.source.revision.c_str(), s.source.commit.c_str(), s.source.path.c_str());
  switch (s.kind) {
    case io::ModelSummary::Kind::Checkpoint:
      print_weights(s.components.front().weights, "  ");
      return;
    case io::ModelSummary::Kind::Component: {
      const auto& c = s.components.front();
      std::printf("  component: %s%s\n",
                  c.class_name.empty() ? "(no class in its config)" : c.class_name.c_str(),
                  c.note.empty() ? "" : (" (" + c.note + ")").c_str());
      if (c.has_weights) print_weights(c.weights, "  ");
      return;
    }
    case io::ModelSummary::Kind::Pipeline:
      break;
  }
  std::printf("  pipeline: %s\n  components:\n", s.class_name.c_str());
  int64_t read_bytes = 0;  // what the weights kiln generate reads take in memory, in bf16
  for (const auto& c : s.components) {
    std::string what = c.class_name.empty() ? "-" : c.class_name;
    if (!c.library.empty()) what += " (" + c.library + ")";
    if (!c.present)
      what += "  [absent: " + c.note + "]";
    else if (!c.note.empty())
      what += "  [" + c.note + "]";
    std::printf("    %-18s %s\n", c.name.c_str(), what.c_str());
    if (!c.has_weights) continue;
    print_weights(c.weights, "      ");
    const LoadedWeights loaded = loaded_weights(s, c);
    if (!loaded.note.empty())
      std::printf("      %s: %s parameters, %s in bf16\n", loaded.note.c_str(),
                  with_commas(loaded.parameters).c_str(), format_bytes(2 * loaded.parameters).c_str());
    for (const auto& [name, parameters] : loaded.tensors) read_bytes += bf16_bytes(c, name, parameters);
  }
  std::printf("  total: %s parameters (%s); %s on disk, %s in memory\n",
              with_commas(s.total.parameters).c_str(), dtype_list(s.total.parameters_by_dtype, true).c_str(),
              format_bytes(s.total.bytes_on_disk).c_str(), format_bytes(s.total.bytes_in_memory).c_str());
  // What `kiln generate` holds by default in bf16 (the weights it reads, at 2 bytes per parameter, fp8
  // Linear weights at 1).
  std::printf("  memory (kiln generate, bf16, default): %s\n",
              plan_weight_packing(read_bytes, std::nullopt).describe().c_str());
}

// Numbers inside names compare as numbers ("blocks.2" before "blocks.10"), so that blocks come in the order
// they run.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      const std::string na = a.substr(i, ei - i), nb = b.substr(j, ej - j);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ei;
      j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// `kiln info MODEL --max-memory SIZE`: the offload kiln generate --max-memory would pick, with what each
// component holds while it runs (weights in bf16, kiln generate's default dtype).
void print_offload_plan(const io::ModelSummary& s, int64_t budget) {
  std::vector<ComponentWeights> components;
  for (const auto& c : s.components) {
    if (!c.has_weights) continue;
    ComponentWeights w{c.name, {}};
    const std::map<std::string, nn::BlockPosition> blocks = component_block_positions(c);
    for (const auto& [name, parameters] : loaded_weights(s, c).tensors) {
      const auto block = blocks.find(name);
      w.tensors.push_back({name, bf16_bytes(c, name, parameters),
                           block == blocks.end() ? nn::BlockPosition{} : block->second});
    }
    std::sort(w.tensors.begin(), w.tensors.end(),
              [](const auto& x, const auto& y) { return natural_less(x.name, y.name); });
    components.push_back(std::move(w));
  }
  const OffloadPlan plan = plan_offload(components, budget);
  std::printf("  %s\n", plan.describe().c_str());
  std::istringstream lines(plan.describe_residency());
  for (std::string line; std::getline(lines, line);) std::printf("  %s\n", line.c_str());
}

// `kiln info MODEL --max-memory SIZE --device D`: the plan kiln generate --device D --max-memory SIZE would
// make for an image of `height` x `width` (the pipeline's default size when 0): the activations' estimate
// kept free and the offload the weights get (weights in bf16). Loads the pipeline (its files mapped, nothing
// computed).
void print_device_offload_plan(const std::string& model, const std::string& revision, int64_t budget,
                               const Device& device, int64_t height, int64_t width) {
  auto pipe = DiffusionPipeline::from_pretrained(model, {.dtype = bfloat16, .revision = revision});
  PipelineRequest request;
  const int64_t h = height > 0 ? height : pipe->defaults().height;
  const int64_t w = width > 0 ? width : pipe->defaults().width;
  request.height = h;
  request.width = w;
  const OffloadPlan plan = pipe->plan_device_budget(budget, device, request);
  std::printf("  on %s at %lldx%lld: %s\n", device.str().c_str(), static_cast<long long>(h),
              static_cast<long long>(w), plan.describe().c_str());
  std::printf("  keeps %s free (an estimate)\n",
              pipe->estimate_activations(request, device).describe().c_str());
  std::istringstream lines(plan.describe_residency());
  for (std::string line; std::getline(lines, line);) std::printf("  %s\n", line.c_str());
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print what a checkpoint or model holds");
  struct Args {
    std::string model, revision, variant;
    std::optional<std::string> max_memory, device;
    int64_t height = 0, width = 0;
    bool devices = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("model", args->model,
                  "a .safetensors or .gguf file (a LoRA file: its layout and the layers it reaches), a "
                  "*.safetensors.index.json, a component or pipeline folder, "
                  "or a Hugging Face repo id in the local cache (org/name[@revision])");
  cmd->add_flag("--devices", args->devices,
                "list the devices this build can run on: the cpu, and those of each installed PJRT plugin "
                "(xla-cpu, cuda, tpu)");
  cmd->add_option("--revision", args->revision,
                  "branch, tag or commit of a cached Hugging Face repo (default main)");
  cmd->add_option("--variant", args->variant,
                  "weights variant, e.g. fp16 or bf16 (diffusion_pytorch_model.fp16.safetensors)");
  cmd->add_option("--max-memory", args->max_memory,
                  "also print the offload kiln generate --max-memory SIZE would pick (e.g. 12GiB): what each "
                  "component holds while it runs and the expected peak");
  cmd->add_option(
      "--device", args->device,
      "with --max-memory: plan as kiln generate --device D --max-memory SIZE would (xla-cpu, cuda, "
      "tpu): an estimate of the image's activations kept free, the offload onto D for the rest");
  cmd->add_option("--height", args->height, "with --device: the image's height (default: the pipeline's)")
      ->check(CLI::Range(int64_t{1}, int64_t{limits::kMaxImageSide}));
  cmd->add_option("--width", args->width, "with --device: the image's width (default: the pipeline's)")
      ->check(CLI::Range(int64_t{1}, int64_t{limits::kMaxImageSide}));
  cmd->callback([args] {
    if (args->devices) {
      KILN_CHECK(args->model.empty(), "kiln info: give a model or --devices, not both");
      print_devices();
      return;
    }
    KILN_CHECK(!args->model.empty(), "kiln info: give a model (a file, folder or repo id) or --devices");
    const Device device = args->device ? Device(*args->device) : cpu;
    KILN_CHECK(!args->device || args->max_memory,
               "kiln info: --device " << *args->device << " plans --max-memory on it; give --max-memory too");
    KILN_CHECK((args->height == 0 && args->width == 0) || device.type != DeviceType::CPU,
               "kiln info: --height and --width size the activations of a plan on a device; give --device");
    if (args->model.size() > 5 && args->model.substr(args->model.size() - 5) == ".gguf") {
      print_gguf_info(args->model);
      return;
    }
    const std::string& m = args->model;
    if (m.size() > 12 && m.substr(m.size() - 12) == ".safetensors" && std::filesystem::is_regular_file(m) &&
        print_lora_info(m))
      return;
    const auto summary = io::summarize_model(args->model, {.revision = args->revision}, args->variant);
    print_summary(args->model, summary);
    if (!args->max_memory) return;
    const int64_t budget = parse_byte_budget(*args->max_memory, "--max-memory");
    if (device.type == DeviceType::CPU)
      print_offload_plan(summary, budget);
    else
      print_device_offload_plan(args->model, args->revision, budget, device, args->height, args->width);
  });
}

}  // namespace kiln::cli
