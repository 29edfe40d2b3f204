// The reference-image preprocessing of the FLUX.2 pipelines against PIL and diffusers
// (tools/goldens/flux2.py -> tests/data/goldens/flux2/lanczos.safetensors): PIL's LANCZOS resize bit for bit
// on both pass orders, up- and downscaling, RGB and gray; and a reference image over the 1024^2 area cap,
// shrunk and cropped as Flux2Pipeline does.
#include <gtest/gtest.h>

#include "families/flux2/flux2_reference_image.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops.h"
#include "pipelines/pil_resize.h"
#include "support/test_data.h"

namespace kiln {
namespace {

Image image_of(const Tensor& hwc) {
  Image image;
  image.height = static_cast<int>(hwc.size(0));
  image.width = static_cast<int>(hwc.size(1));
  image.channels = static_cast<int>(hwc.size(2));
  image.pixels = hwc.contiguous().to_vector<uint8_t>();
  return image;
}

TEST(LanczosResize, MatchesPilBitForBit) {
  io::SafetensorsFile g(testing::data_path("goldens/flux2/lanczos.safetensors"));
  int cases = 0;
  for (const std::string& name : g.names()) {
    if (name.size() < 3 || name.substr(name.size() - 3) != ".in") continue;
    const std::string stem = name.substr(0, name.size() - 3);
    const Tensor expected = g.tensor(stem + ".out");
    const Image out = pipelines::resize_lanczos(image_of(g.tensor(name)), static_cast<int>(expected.size(1)),
                                                static_cast<int>(expected.size(0)));
    EXPECT_EQ(out.pixels, expected.to_vector<uint8_t>()) << stem;
    ++cases;
  }
  EXPECT_EQ(cases, 5);
  Image one = image_of(Tensor::zeros({2, 2, 3}, uint8));
  EXPECT_THROW(pipelines::resize_lanczos(one, 0, 4), Error);
}

TEST(Flux2ReferenceImage, LargeImagesAreShrunkToTheAreaCapAsDiffusersDoes) {
  const Image large = Image::load(testing::data_path("goldens/flux2/ref_large.png"));
  ASSERT_EQ(large.width, 1100);
  const Tensor pixels = pipelines::preprocess_flux2_reference(large, 16);
  // 1100x1000 -> 1075x977 (scale sqrt(1024^2 / 1.1e6)), cropped to 1072x976.
  ASSERT_EQ(pixels.shape(), (Shape{1, 3, 976, 1072}));
  const Image expected = Image::load(testing::data_path("goldens/flux2/ref_large_preprocessed.png"));
  const Tensor want = Tensor::from_vector(expected.pixels, {976, 1072, 3}).to(float32);
  const Tensor expected_pixels = sub(mul(div(want, 255.0), 2.0), 1.0).permute({2, 0, 1}).unsqueeze(0);
  EXPECT_TRUE(testing::all_close(pixels, expected_pixels, 0, 0));
}

TEST(Flux2ReferenceImage, GrayAndAlphaBecomeRgb) {
  Image gray;
  gray.width = 64;
  gray.height = 80;
  gray.channels = 1;
  gray.pixels.resize(64 * 80);
  for (size_t i = 0; i < gray.pixels.size(); ++i) gray.pixels[i] = static_cast<uint8_t>(i * 7);
  Image rgba = gray;
  rgba.channels = 4;
  rgba.pixels.clear();
  for (uint8_t v : gray.pixels) rgba.pixels.insert(rgba.pixels.end(), {v, v, v, 17});
  const Tensor a = pipelines::preprocess_flux2_reference(gray, 16);
  EXPECT_EQ(a.shape(), (Shape{1, 3, 80, 64}));
  EXPECT_TRUE(testing::all_close(a, pipelines::preprocess_flux2_reference(rgba, 16), 0, 0));
  EXPECT_TRUE(testing::all_close(a.select(1, 0), a.select(1, 2), 0, 0));
}

}  // namespace
}  // namespace kiln
