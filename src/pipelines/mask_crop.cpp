#include "pipelines/mask_crop.h"

#include <algorithm>
#include <cmath>

#include "kiln/core/error.h"
#include "pipelines/pil_convert.h"
#include "pipelines/pil_resize.h"

namespace kiln::pipelines {

namespace {

// Python's a // 2.
int64_t floor_half(int64_t a) {
  return static_cast<int64_t>(std::floor(static_cast<double>(a) / 2));
}

// get_crop_region's step 3 along one axis: [lo, hi) grown by int(desired - (hi - lo)), half before (rounded
// down) and the rest after, then moved back inside [0, size).
void grow_to(int64_t& lo, int64_t& hi, double desired, int64_t size) {
  const auto diff = static_cast<int64_t>(desired - static_cast<double>(hi - lo));  // int(): toward zero
  lo -= floor_half(diff);
  hi += diff - floor_half(diff);
  if (hi >= size) {
    const int64_t over = hi - size;
    hi -= over;
    lo -= over;
  }
  if (lo < 0) {
    hi -= lo;
    lo = 0;
  }
  if (hi >= size) hi = size;
}

Image blank(int width, int height, int channels) {
  Image image;
  image.width = width;
  image.height = height;
  image.channels = channels;
  image.pixels.assign(static_cast<size_t>(width) * height * channels, 0);
  return image;
}

// Image.paste(src, (x, y)) of an image with the same channels: the part that falls inside `dst` copied.
void paste(Image& dst, const Image& src, int x, int y) {
  const int x0 = std::max(x, 0), y0 = std::max(y, 0);
  const int x1 = std::min(x + src.width, dst.width), y1 = std::min(y + src.height, dst.height);
  if (x1 <= x0 || y1 <= y0) return;
  const size_t ch = static_cast<size_t>(dst.channels);
  for (int row = y0; row < y1; ++row)
    std::copy_n(&src.pixels[(static_cast<size_t>(row - y) * src.width + (x0 - x)) * ch],
                static_cast<size_t>(x1 - x0) * ch,
                &dst.pixels[(static_cast<size_t>(row) * dst.width + x0) * ch]);
}

// Python's a * b // c for the positive sizes _resize_and_fill and _resize_and_crop compute.
int scaled(int a, int b, int c) {
  return static_cast<int>(static_cast<int64_t>(a) * b / c);
}

// _resize_and_crop(image, width, height): resized to cover width x height keeping its aspect ratio, centred,
// the overflow cut off.
Image resize_and_crop(const Image& image, int width, int height) {
  const double ratio = static_cast<double>(width) / height;
  const double src_ratio = static_cast<double>(image.width) / image.height;
  const int src_w = ratio > src_ratio ? width : scaled(image.width, height, image.height);
  const int src_h = ratio <= src_ratio ? height : scaled(image.height, width, image.width);
  Image out = blank(width, height, 3);
  paste(out, resize_lanczos(image, src_w, src_h), width / 2 - src_w / 2, height / 2 - src_h / 2);
  return out;
}

// PIL's DIV255 (a value in [0, 255 * 255] divided by 255, rounded) and MULDIV255.
uint32_t div255(uint32_t a) {
  const uint32_t t = a + 128;
  return ((t >> 8) + t) >> 8;
}

// ImageOps.invert(mask.convert("L")) as an alpha, and the original as premultiplied RGBA pasted through it
// onto transparent black, then converted back to straight RGBA: apply_overlay's init_image_masked.
std::vector<uint8_t> masked_original(const Image& mask, const Image& original) {
  const Image gray = to_luma(mask);
  const size_t n = static_cast<size_t>(original.width) * original.height;
  const size_t ch = static_cast<size_t>(original.channels);
  std::vector<uint8_t> rgba(n * 4);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = &original.pixels[i * ch];
    // convert("RGBA"): gray repeated, opaque unless the image has alpha; then "RGBa": colour times alpha.
    const uint32_t alpha = ch == 2 || ch == 4 ? p[ch - 1] : 255;
    uint32_t px[4] = {p[0], p[ch >= 3 ? 1 : 0], p[ch >= 3 ? 2 : 0], alpha};
    for (int c = 0; c < 3; ++c) px[c] = div255(px[c] * alpha);
    // paste with an "L" mask onto zeros blends all four bytes: DIV255(0 * (255 - m) + v * m).
    const uint32_t m = 255u - gray.pixels[i];
    for (uint32_t& v : px) v = div255(v * m);
    // RGBa -> RGBA (rgba2rgbA): divided back by alpha unless it is 0 or 255.
    const uint32_t a = px[3];
    for (int c = 0; c < 3; ++c)
      rgba[i * 4 + c] = static_cast<uint8_t>(a == 0 || a == 255 ? px[c] : std::min(255u, 255 * px[c] / a));
    rgba[i * 4 + 3] = static_cast<uint8_t>(a);
  }
  return rgba;
}

}  // namespace

CropRegion mask_crop_region(const Image& mask, int64_t width, int64_t height, int64_t pad) {
  check_image(mask, "mask_image");
  KILN_CHECK(pad >= 0, "padding_mask_crop must be a number of pixels >= 0, got " << pad);
  KILN_CHECK(width >= 1 && height >= 1,
             "mask_crop_region: the size " << width << "x" << height << " is empty");
  const Image gray = to_luma(mask);
  const int64_t w = gray.width, h = gray.height;
  int64_t left = w, right = -1, top = h, bottom = -1;  // the non-black pixels' columns and rows, inclusive
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      if (gray.pixels[static_cast<size_t>(y * w + x)] != 0) {
        left = std::min(left, x);
        right = std::max(right, x);
        top = std::min(top, y);
        bottom = std::max(bottom, y);
      }
  KILN_CHECK(right >= 0, "padding_mask_crop: the "
                             << w << "x" << h
                             << " mask_image has no pixel to repaint (all black), so there "
                                "is no region to crop around");
  int64_t x1 = std::max(left - pad, int64_t{0}), y1 = std::max(top - pad, int64_t{0});
  int64_t x2 = std::min(right + 1 + pad, w), y2 = std::min(bottom + 1 + pad, h);
  const double ratio_crop = static_cast<double>(x2 - x1) / static_cast<double>(y2 - y1);
  const double ratio_processing = static_cast<double>(width) / static_cast<double>(height);
  if (ratio_crop > ratio_processing)
    grow_to(y1, y2, static_cast<double>(x2 - x1) / ratio_processing, h);
  else
    grow_to(x1, x2, static_cast<double>(y2 - y1) * ratio_processing, w);
  return {static_cast<int>(x1), static_cast<int>(y1), static_cast<int>(x2), static_cast<int>(y2)};
}

Image crop_and_fill(const Image& image, const CropRegion& region, int64_t width64, int64_t height64) {
  check_image(image, "image");
  const int width = static_cast<int>(width64), height = static_cast<int>(height64);
  KILN_CHECK(width >= 1 && height >= 1 && width == width64 && height == height64,
             "crop_and_fill: the size " << width64 << "x" << height64 << " is not a positive image size");
  const Image cropped = to_rgb(crop(image, region.left, region.top, region.width(), region.height()));
  const double ratio = static_cast<double>(width) / height;
  const double src_ratio = static_cast<double>(cropped.width) / cropped.height;
  const int src_w = ratio < src_ratio ? width : scaled(cropped.width, height, cropped.height);
  const int src_h = ratio >= src_ratio ? height : scaled(cropped.height, width, cropped.width);
  const Image resized = resize_lanczos(cropped, src_w, src_h);
  Image out = blank(width, height, 3);
  paste(out, resized, width / 2 - src_w / 2, height / 2 - src_h / 2);
  // The margins: the resized image's edge line (a box of zero extent) stretched over them, with PIL's default
  // filter (diffusers passes none there).
  const auto rw = static_cast<float>(resized.width), rh = static_cast<float>(resized.height);
  if (ratio < src_ratio) {
    const int fill = height / 2 - src_h / 2;
    if (fill > 0) {
      paste(out,
            resize_pil(resized, width, fill, ResizeFilter::Bicubic, {0, 0, static_cast<float>(width), 0}), 0,
            0);
      paste(out,
            resize_pil(resized, width, fill, ResizeFilter::Bicubic, {0, rh, static_cast<float>(width), rh}),
            0, fill + src_h);
    }
  } else if (ratio > src_ratio) {
    const int fill = width / 2 - src_w / 2;
    if (fill > 0) {
      paste(out,
            resize_pil(resized, fill, height, ResizeFilter::Bicubic, {0, 0, 0, static_cast<float>(height)}),
            0, 0);
      paste(out,
            resize_pil(resized, fill, height, ResizeFilter::Bicubic, {rw, 0, rw, static_cast<float>(height)}),
            fill + src_w, 0);
    }
  }
  return out;
}

Image paste_back(const Image& mask, const Image& original, const Image& generated, const CropRegion& region) {
  check_image(mask, "mask_image");
  check_image(original, "image");
  check_image(generated, "generated image");
  KILN_CHECK(mask.width == original.width && mask.height == original.height,
             "padding_mask_crop: the mask_image (" << mask.width << "x" << mask.height
                                                   << ") must have the image's size (" << original.width
                                                   << "x" << original.height << ") to paste the result back");
  KILN_CHECK(
      region.left >= 0 && region.top >= 0 && region.right <= original.width &&
          region.bottom <= original.height && region.width() > 0 && region.height() > 0,
      "paste_back: the region is not inside the " << original.width << "x" << original.height << " image");
  const std::vector<uint8_t> over = masked_original(mask, original);
  // The generated image covering the region, on black elsewhere (an opaque destination).
  Image base = blank(original.width, original.height, 3);
  paste(base, resize_and_crop(to_rgb(generated), region.width(), region.height()), region.left, region.top);
  // alpha_composite(base as RGBA, over): Pillow's AlphaComposite.c with 7 extra bits of precision.
  constexpr uint32_t kBits = 7;
  Image out = blank(original.width, original.height, 3);
  const size_t n = static_cast<size_t>(original.width) * original.height;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* src = &over[i * 4];
    const uint8_t* dst = &base.pixels[i * 3];
    uint8_t* o = &out.pixels[i * 3];
    if (src[3] == 0) {
      std::copy_n(dst, 3, o);
      continue;
    }
    const uint32_t dst_alpha = 255, blend = dst_alpha * (255u - src[3]);
    const uint32_t outa255 = src[3] * 255u + blend;
    const uint32_t coef1 = src[3] * 255u * 255u * (1u << kBits) / outa255;
    const uint32_t coef2 = 255u * (1u << kBits) - coef1;
    for (int c = 0; c < 3; ++c) {
      const uint32_t t = src[c] * coef1 + dst[c] * coef2 + (0x80u << kBits);
      o[c] = static_cast<uint8_t>((((t >> 8) + t) >> 8) >> kBits);
    }
  }
  out.metadata = generated.metadata;
  return out;
}

}  // namespace kiln::pipelines
