// A WeightSource that shows a checkpoint in another layout under a model's names: each model tensor is a
// file tensor, rows [begin, end) of one (a fused qkv split), or one with its two halves swapped (a
// (shift, scale) projection read as (scale, shift)). Rows are whole rows of blocks in quantized storage, so a
// GGUF file's quantized tensors are split and swapped without being dequantized. Used for the original
// single-file layouts that diffusers' from_single_file converts (kiln/models/*_single_file.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/nn/module.h"

namespace kiln::nn {

class MappedWeights final : public WeightSource {
 public:
  struct Entry {
    std::string source;           // the file's name for it (without `prefix`)
    int64_t begin = 0, end = -1;  // rows of the file tensor; end -1: all
    bool swap_halves = false;
  };
  using Mapping = std::vector<std::pair<std::string, Entry>>;  // model name -> where it comes from

  // `prefix` is prepended to every source name ("model.diffusion_model." in ComfyUI checkpoints; file
  // tensors outside it belong to other components and are not reported). `layout` names the file's layout
  // in errors. Throws kiln::Error naming the file and the first tensor that is missing, or whose rows do
  // not match the split (a fused tensor must be consumed exactly).
  MappedWeights(std::shared_ptr<const WeightSource> inner, Mapping mapping, std::string prefix,
                std::string layout);

  bool contains(const std::string& name) const override;
  Shape shape(const std::string& name) const override;
  Tensor load(const std::string& name) const override;
  quant::QuantizedTensor load_quantized(const std::string& name) const override;
  // The model's names, then any file tensor that maps to none (which load_weights reports as unexpected).
  std::vector<std::string> names() const override;
  std::string description() const override { return inner_->description(); }

  // `prefix` when some tensor of `w` is named under it, else "".
  static std::string prefix_if_present(const WeightSource& w, const std::string& prefix);

 private:
  const Entry& entry(const std::string& name) const;

  std::shared_ptr<const WeightSource> inner_;
  Mapping entries_;  // sorted by model name
  std::string prefix_;
  std::vector<std::string> unmapped_;
};

// Builds a MappedWeights::Mapping, entry by entry.
struct MappingBuilder {
  MappedWeights::Mapping entries;
  // `to` <- rows [begin, end) of `from` (end -1: all), halves swapped when `swap`.
  void add(const std::string& to, const std::string& from, int64_t begin = 0, int64_t end = -1,
           bool swap = false) {
    entries.emplace_back(to, MappedWeights::Entry{from, begin, end, swap});
  }
  // A Linear's weight and bias.
  void linear(const std::string& to, const std::string& from) {
    add(to + ".weight", from + ".weight");
    add(to + ".bias", from + ".bias");
  }
  // Consecutive row ranges of a fused Linear's weight and bias: `parts` are (model Linear, rows).
  void split(const std::string& from, const std::vector<std::pair<std::string, int64_t>>& parts) {
    int64_t row = 0;
    for (const auto& [to, rows] : parts) {
      add(to + ".weight", from + ".weight", row, row + rows);
      add(to + ".bias", from + ".bias", row, row + rows);
      row += rows;
    }
  }
  // A (shift, scale) projection read as (scale, shift): weight and bias with halves swapped.
  void swapped(const std::string& to, const std::string& from) {
    add(to + ".weight", from + ".weight", 0, -1, true);
    add(to + ".bias", from + ".bias", 0, -1, true);
  }
};

}  // namespace kiln::nn
