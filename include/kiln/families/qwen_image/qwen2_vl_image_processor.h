// transformers' Qwen2VLImageProcessor as Qwen-Image-Edit's processor/ folder loads it under transformers 5
// with torchvision installed (AutoImageProcessor's default backend): the image resized to a multiple of
// patch_size * merge_size within [min_pixels, max_pixels] (smart_resize) with torchvision's antialiased
// bicubic on 8-bit pixels (torch's fixed-point uint8 kernel: a horizontal then a vertical pass, each rounded
// to 8 bits), rescaled and normalised in float32 ((x - mean * 255) / (std * 255), the fused form), then cut
// into patches merge_size x merge_size at a time, each patch's values channel-major and repeated
// temporal_patch_size times (a still image is a clip of identical frames).
#pragma once

#include <string>
#include <vector>

#include "kiln/models/qwen2_5_vl_vision.h"
#include "kiln/pipelines/image.h"

namespace kiln::models {

struct Qwen2VLImageProcessorConfig {
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  bool do_resize = true;
  bool do_rescale = true;
  bool do_normalize = true;
  double rescale_factor = 1.0 / 255.0;
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};

  // A preprocessor_config.json (transformers 4: min_pixels / max_pixels, or a size dict) or a
  // processor_config.json whose "image_processor" object holds the same (transformers 5's save_pretrained).
  // Only the bicubic resample (3) is supported.
  static Qwen2VLImageProcessorConfig from_file(const std::string& path);
  // A processor/ folder: its preprocessor_config.json, else its processor_config.json.
  static Qwen2VLImageProcessorConfig from_folder(const std::string& folder);
};

struct QwenVLImageInput {
  Tensor pixel_values;  // [grid.h * grid.w, 3 * temporal_patch_size * patch_size^2] float32
  ImageGrid grid;       // t = 1
};

// transformers' smart_resize: the (height, width) an image is resized to. Throws when the aspect ratio is
// over 200, as transformers does.
std::pair<int64_t, int64_t> qwen2_vl_smart_resize(int64_t height, int64_t width, int64_t factor,
                                                  int64_t min_pixels, int64_t max_pixels);

// One image (gray, RGB or with alpha: made RGB as PIL's convert("RGB") does, alpha dropped) -> its patches.
QwenVLImageInput qwen2_vl_preprocess(const Image& image, const Qwen2VLImageProcessorConfig& config);

// The processor's text expansion: the k-th "<|image_pad|>" of `text` repeated once per merged patch of
// grids[k] (grid.t * grid.h * grid.w / merge_size^2 times). The counts must match.
std::string qwen2_vl_expand_image_tokens(const std::string& text, const std::vector<ImageGrid>& grids,
                                         int64_t merge_size);

}  // namespace kiln::models
