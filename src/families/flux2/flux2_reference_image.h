// How Flux2Pipeline and Flux2KleinPipeline preprocess a reference image (diffusers' Flux2ImageProcessor and
// the pipelines' __call__): check the size (sides of at least 64 pixels, aspect ratio at most 8), shrink an
// image of more than 1024 x 1024 pixels of area to that area (PIL's Lanczos), centre-crop to multiples of
// `multiple` (the VAE scale factor times the 2x2 patch, 16), convert to RGB, and map [0, 255] to [-1, 1] in
// float32.
#pragma once

#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/pipelines/image.h"

namespace kiln::pipelines {

// -> [1, 3, h, w] float32. Throws kiln::Error naming the image's size for one that is too small, too
// elongated, or not 1-, 2-, 3- or 4-channel 8-bit pixels.
Tensor preprocess_flux2_reference(const Image& image, int64_t multiple);

}  // namespace kiln::pipelines
