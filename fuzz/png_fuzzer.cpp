// PNG files given as FLUX.2 reference images (`kiln generate --image`, Image::load): libpng's decoding
// (every colour type and bit depth, palettes, transparency, interlacing, text chunks) behind Kiln's own
// checks, then a decoded image goes through the FLUX.2 pipelines' preprocessing (size checks, the Lanczos
// shrink of a large image, centre crop, RGB conversion), which must give [1, 3, h, w] with h and w multiples
// of 16.
#include "families/flux2/flux2_reference_image.h"
#include "fuzz_support.h"
#include "kiln/pipelines/image.h"

using namespace kiln;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::make_runtime_deterministic();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file("reference.png");
  file.assign({reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean([&] {
    const Image image = Image::load(file.path());
    fuzz::require(
        image.width > 0 && image.height > 0 &&
            image.pixels.size() == size_t(image.width) * size_t(image.height) * size_t(image.channels),
        "decoded pixels do not fill the image");
    const Tensor t = pipelines::preprocess_flux2_reference(image, 16);
    fuzz::require(
        t.dim() == 4 && t.size(0) == 1 && t.size(1) == 3 && t.size(2) % 16 == 0 && t.size(3) % 16 == 0,
        "preprocessed reference image of an unexpected shape");
    fuzz::touch(t.raw_data(), t.nbytes());
  });
  return 0;
}
