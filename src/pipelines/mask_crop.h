// diffusers' `padding_mask_crop` for the inpainting pipelines (FluxInpaintPipeline,
// StableDiffusion3InpaintPipeline), bit for bit with the PIL calls diffusers makes: the region around the
// mask, grown by the padding and to the call's aspect ratio (VaeImageProcessor.get_crop_region); the image
// and the mask cropped to it and fitted into the call's size, the margins filled by stretching the edge rows
// or columns (resize_mode="fill", _resize_and_fill); and the generated image pasted back into the original
// through the mask (apply_overlay: PIL's RGBa paste and alpha_composite, in their integer arithmetic).
#pragma once

#include <cstdint>

#include "kiln/pipelines/image.h"

namespace kiln::pipelines {

// A rectangle of an image in pixels: columns [left, right), rows [top, bottom).
struct CropRegion {
  int left = 0, top = 0, right = 0, bottom = 0;
  int width() const { return right - left; }
  int height() const { return bottom - top; }
  bool operator==(const CropRegion&) const = default;
};

// get_crop_region(mask, width, height, pad): the bounding box of the mask's non-black pixels (in PIL's "L"),
// `pad` pixels wider on each side, then grown on its short side to the aspect ratio of width x height and
// moved back inside the mask. Throws kiln::Error for a mask without any non-black pixel (diffusers divides by
// zero there) or a negative pad.
CropRegion mask_crop_region(const Image& mask, int64_t width, int64_t height, int64_t pad);

// preprocess(image, crops_coords=region, resize_mode="fill")'s PIL part: the region cropped, resized with
// Lanczos to fit inside width x height keeping its aspect ratio, centred, and the margins filled with the
// resized image's first and last rows (or columns) stretched. RGB (gray repeated; alpha dropped first, which
// is exact for opaque images).
Image crop_and_fill(const Image& image, const CropRegion& region, int64_t width, int64_t height);

// apply_overlay(mask, original, generated, region): `generated` resized to cover the region (resize_mode
// "crop"), placed there on black, and the original composited over it where the mask is black (its inverse
// luma as alpha, through PIL's RGBa paste and alpha_composite). The result has the original's size; the mask
// must have it too. Keeps `generated`'s metadata.
Image paste_back(const Image& mask, const Image& original, const Image& generated, const CropRegion& region);

}  // namespace kiln::pipelines
