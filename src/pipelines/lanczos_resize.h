// PIL's Image.resize(size, Image.LANCZOS) of an 8-bit image, bit for bit (Pillow's Resample.c): separable
// Lanczos-3 filtering with coefficients in 22-bit fixed point, horizontal pass first unless the height
// shrinks more than twice as much as the width. Flux2Pipeline shrinks reference images larger than 1024^2
// pixels with it.
#pragma once

#include <cstdint>

#include "kiln/pipelines/image.h"

namespace kiln::pipelines {

// `image` resized to width x height (each at least 1); any channel count, each channel filtered alike (as PIL
// does for L and RGB; PIL resizes LA/RGBA premultiplied by alpha, which equals this for opaque images).
Image resize_lanczos(const Image& image, int width, int height);

}  // namespace kiln::pipelines
