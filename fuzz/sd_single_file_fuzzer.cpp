// The SD1.x / SDXL single-file reader (src/families/stable_diffusion/sd_single_file.h) on any checkpoint
// header: the input is a list of tensors, one per line, "name d0,d1,..." (a file's names and shapes, which is
// all the reader looks at before loading). It must refuse with a kiln::Error or give views whose every tensor
// it names has a shape and loads, under diffusers' names, from tensors of the input.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "families/stable_diffusion/sd_single_file.h"
#include "fuzz_support.h"
#include "kiln/core/tensor.h"

using namespace kiln;

namespace {

// A checkpoint of the input's names and shapes, each tensor one element broadcast to its shape (no memory).
class Header final : public nn::WeightSource {
 public:
  explicit Header(std::map<std::string, Shape> shapes) : shapes_(std::move(shapes)) {}
  bool contains(const std::string& name) const override { return shapes_.count(name) != 0; }
  Shape shape(const std::string& name) const override {
    const auto it = shapes_.find(name);
    KILN_CHECK(it != shapes_.end(), "no tensor " << name);
    return it->second;
  }
  Tensor load(const std::string& name) const override {
    const Shape s = shape(name);
    return Tensor::zeros(Shape(s.size(), 1), float32).expand(s);
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& entry : shapes_) out.push_back(entry.first);
    return out;
  }
  std::string description() const override { return "fuzz.safetensors"; }

 private:
  std::map<std::string, Shape> shapes_;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::make_runtime_deterministic();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, Shape> shapes;
  for (std::string_view line : fuzz::split({reinterpret_cast<const char*>(data), size}, "\n", 20000)) {
    const size_t space = line.rfind(' ');
    if (space == std::string_view::npos || space == 0) continue;
    Shape shape;
    bool ok = true;
    for (std::string_view d : fuzz::split(line.substr(space + 1), ",", 8)) {
      if (d.empty() || d.size() > 6 || d.find_first_not_of("0123456789") != std::string_view::npos) {
        ok = false;
        break;
      }
      shape.push_back(std::stoll(std::string(d)));
    }
    if (ok) shapes[std::string(line.substr(0, space))] = shape;
  }
  fuzz::expect_clean([&] {
    const models::StableDiffusionSingleFile file =
        models::read_stable_diffusion_single_file(std::make_shared<Header>(std::move(shapes)));
    fuzz::require(file.unet != nullptr, "a file read without a UNet");
    for (const auto* view :
         {file.unet.get(), file.text_encoder.get(), file.text_encoder_2.get(), file.vae.get()}) {
      if (view == nullptr) continue;
      for (const std::string& name : view->names()) {
        const Shape s = view->shape(name);
        fuzz::require(view->load(name).shape() == s, "a view's tensor loads with another shape than it says");
      }
    }
  });
  return 0;
}
