#include "families/stable_diffusion/sd_components.h"

#include "kiln/core/error.h"

namespace kiln::models {

namespace {

std::string joined(const std::vector<int64_t>& v) {
  std::string out;
  for (int64_t x : v) out += (out.empty() ? "" : ", ") + std::to_string(x);
  return out;
}

}  // namespace

std::shared_ptr<UNet2DConditionModel> load_unet(const std::string& folder, DType dtype,
                                                const StableDiffusionSingleFile* file,
                                                const nn::TensorParallel& tp) {
  if (file == nullptr) return load_unet_2d_condition(folder, dtype, tp);
  UNet2DConditionConfig config = UNet2DConditionConfig::from_file(folder);
  // An inpainting finetune on its base model's configs: the only difference is the first convolution's input.
  if (file->in_channels == 9 && config.in_channels == 4) config.in_channels = 9;
  const std::string& from = file->unet->description();
  KILN_CHECK(config.in_channels == file->in_channels &&
                 config.cross_attention_dim == file->cross_attention_dim &&
                 config.block_out_channels == file->block_out_channels,
             from << ": a UNet of " << file->in_channels << " input channels, a " << file->cross_attention_dim
                  << "-wide context and levels of " << joined(file->block_out_channels) << " channels, but "
                  << folder << "/config.json describes " << config.in_channels << ", "
                  << config.cross_attention_dim << " and " << joined(config.block_out_channels)
                  << ": give the configs of the model it was finetuned from");
  auto model = std::make_shared<UNet2DConditionModel>(config, tp);
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(*file->unet, options);
  return model;
}

}  // namespace kiln::models
