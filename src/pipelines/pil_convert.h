// PIL's mode conversions of 8-bit images, bit for bit (Pillow's Convert.c), and its crop, for the
// preprocessing diffusers does with PIL.
#pragma once

#include "kiln/pipelines/image.h"

namespace kiln::pipelines {

// convert("RGB"): gray is repeated, alpha dropped.
Image to_rgb(const Image& image);
// convert("L"): from RGB(A), ITU-R 601-2 luma (R 19595 + G 38470 + B 7471 + 0x8000) >> 16; from L(A), the
// gray.
Image to_luma(const Image& image);
// crop((left, top, left + width, top + height)) of a box inside the image: its pixels copied.
Image crop(const Image& image, int left, int top, int width, int height);
// Throws kiln::Error naming `what` for an image that is not 8-bit pixels of 1 to 4 channels of its size.
void check_image(const Image& image, const char* what);

}  // namespace kiln::pipelines
