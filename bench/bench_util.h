// Helpers shared by the model benchmarks: best-of timing, random tensors and random model weights.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/nn/module.h"

namespace kiln::bench {

// Runs `f` once to warm up (primitive creation, weight prepacking), then `reps` times; the best wall time.
inline double best_of(int reps, const std::function<void()>& f) {
  f();
  synchronize();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    synchronize();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

inline Tensor random(const Shape& shape, DType dtype, Generator& gen, double scale = 0.02) {
  return mul(randn(shape, float32, gen), scale).to(dtype);
}

// Random weights for every parameter a model registers: N(0, 0.02^2) values, 1 for 1-D norm scales, and a
// constant for tensors above `constant_above` elements (position tables), whose values do not change timing.
class RandomWeights : public nn::WeightSource {
 public:
  explicit RandomWeights(nn::Module& model, DType dtype, int64_t constant_above = int64_t{1} << 26)
      : dtype_(dtype), constant_above_(constant_above) {
    for (auto& [name, shape] : model.parameter_shapes()) shapes_[name] = shape;
  }
  bool contains(const std::string& n) const override { return shapes_.count(n) != 0; }
  Shape shape(const std::string& n) const override { return shapes_.at(n); }
  Tensor load(const std::string& n) const override {
    const Shape& s = shapes_.at(n);
    if (n.find("norm") != std::string::npos && s.size() == 1) return Tensor::full(s, 1.0, dtype_);
    if (shape_numel(s) > constant_above_) return Tensor::full(s, 0.01, dtype_);
    return random(s, dtype_, gen_);
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, shape] : shapes_) out.push_back(name);
    return out;
  }
  std::string description() const override { return "random weights"; }

 private:
  DType dtype_;
  int64_t constant_above_;
  std::map<std::string, Shape> shapes_;
  mutable Generator gen_{1};
};

}  // namespace kiln::bench
