// PIL's Image.resize(size, Image.LANCZOS) of an 8-bit image, bit for bit (Pillow's Resample.c): separable
// Lanczos-3 filtering with coefficients in 22-bit fixed point, horizontal pass first unless the height
// shrinks more than twice as much as the width. Flux2Pipeline shrinks reference images larger than 1024^2
// pixels with it, the editing pipelines fit their inputs with it. Also PIL's default filter (bicubic), and a
// source box, which padding_mask_crop's fill uses.
#pragma once

#include <cstdint>

#include "kiln/pipelines/image.h"

namespace kiln::pipelines {

// The source region Image.resize(size, box=...) scales: left, top, right, bottom in pixels, as C floats.
struct ResizeBox {
  float left = 0, top = 0, right = 0, bottom = 0;
};

// `image` resized to width x height (each at least 1); any channel count, each channel filtered alike (as PIL
// does for L and RGB; PIL resizes LA/RGBA premultiplied by alpha, which equals this for opaque images). With
// a box, only that region of the image is scaled (it must lie inside the image; an empty extent is allowed:
// each output pixel then filters the source pixels around that line, as _resize_and_fill's edge strips do).
Image resize_lanczos(const Image& image, int width, int height);

// Image.resize(size, filter, box): Lanczos-3 or bicubic (a = -0.5, PIL's default when no filter is given).
enum class ResizeFilter { Lanczos, Bicubic };
Image resize_pil(const Image& image, int width, int height, ResizeFilter filter, const ResizeBox& box);

}  // namespace kiln::pipelines
