// A checkpoint made of a real model's tensor names and shapes (a real_layouts.json recorded on the meta
// device by the golden tools), for strict loads of full-size models: each tensor is one element broadcast to
// its shape (stride 0), so a model of billions of parameters costs no memory while the loader checks every
// name and shape.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/nn/module.h"

namespace kiln::testing {

class LayoutSource : public nn::WeightSource {
 public:
  // `layout`: {name: shape}; `rename` maps each recorded name to the checkpoint's (identity by default).
  explicit LayoutSource(const nlohmann::json& layout,
                        const std::function<std::string(const std::string&)>& rename = {}) {
    for (auto& [name, shape] : layout.items()) shapes_[rename ? rename(name) : name] = shape.get<Shape>();
  }
  // The tensors in `dtype`: the dtype the model loads in, so that nothing is converted (a conversion would
  // materialise the full shape).
  LayoutSource(std::map<std::string, Shape> shapes, DType dtype)
      : shapes_(std::move(shapes)), dtype_(dtype) {}
  bool contains(const std::string& name) const override { return shapes_.count(name) != 0; }
  Shape shape(const std::string& name) const override { return shapes_.at(name); }
  Tensor load(const std::string& name) const override {
    const Shape& s = shapes_.at(name);
    return Tensor::zeros(Shape(s.size(), 1), dtype_).expand(s);
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& entry : shapes_) out.push_back(entry.first);
    return out;
  }
  std::string description() const override { return "real_layouts.json"; }

 private:
  std::map<std::string, Shape> shapes_;
  DType dtype_ = bfloat16;
};

}  // namespace kiln::testing
