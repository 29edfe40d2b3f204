#include "families/flux2/flux2_reference_image.h"

#include <algorithm>
#include <cmath>

#include "kiln/ops.h"
#include "pipelines/pil_convert.h"
#include "pipelines/pil_resize.h"

namespace kiln::pipelines {

namespace {

// Flux2ImageProcessor.check_image_input's limits and the pipelines' area cap.
constexpr int kMinSide = 64;
constexpr double kMaxAspectRatio = 8.0;
constexpr int64_t kMaxArea = 1024 * 1024;

}  // namespace

Tensor preprocess_flux2_reference(const Image& image, int64_t multiple) {
  check_image(image, "reference image");
  KILN_CHECK(image.width >= kMinSide && image.height >= kMinSide,
             "reference image too small: " << image.width << "x" << image.height
                                           << "; both sides must be at least " << kMinSide << " pixels");
  const double w = image.width, h = image.height;
  const double aspect = std::max(w / h, h / w);
  KILN_CHECK(aspect <= kMaxAspectRatio, "reference image aspect ratio too extreme: "
                                            << image.width << "x" << image.height << " (" << aspect
                                            << ":1; at most " << kMaxAspectRatio << ":1)");
  Image rgb = to_rgb(image);
  if (int64_t{rgb.width} * rgb.height > kMaxArea) {
    // _resize_to_target_area: scale = sqrt(area / (w * h)) in Python floats, sizes truncated.
    const double scale = std::sqrt(static_cast<double>(kMaxArea) / (w * h));
    rgb = resize_lanczos(rgb, static_cast<int>(w * scale), static_cast<int>(h * scale));
  }
  // Floored to multiples, then Flux2ImageProcessor._resize_and_crop: a centre crop (no resize).
  const int64_t width = rgb.width / multiple * multiple, height = rgb.height / multiple * multiple;
  const int64_t left = (rgb.width - width) / 2, top = (rgb.height - height) / 2;
  const Tensor hwc = Tensor::from_vector(rgb.pixels, {rgb.height, rgb.width, 3});
  const Tensor cropped = hwc.narrow(0, top, height).narrow(1, left, width);
  // pil_to_numpy: float32 / 255; normalize: 2 x - 1.
  const Tensor unit = div(cropped.to(float32), 255.0);
  return sub(mul(unit, 2.0), 1.0).permute({2, 0, 1}).unsqueeze(0).contiguous();
}

}  // namespace kiln::pipelines
