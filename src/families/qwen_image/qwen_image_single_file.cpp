#include "families/qwen_image/qwen_image_single_file.h"

#include "kiln/core/error.h"
#include "kiln/nn/gguf_weights.h"
#include "kiln/nn/mapped_weights.h"
#include "kiln/nn/weight_file.h"

namespace kiln::models {

namespace {

constexpr const char* kComfyPrefix = "model.diffusion_model.";

// The tensors that tell a Qwen-Image transformer from the MMDiTs sharing its block names (FLUX.1 and SD3 in
// diffusers' layout have transformer_blocks.0.attn.add_q_proj too, but no img_mod / txt_norm).
const char* const kSignature[] = {"img_in.weight", "txt_norm.weight",
                                  "transformer_blocks.0.img_mod.1.weight"};

// " (a GGUF of arch 'lumina2')" for a GGUF file that names its architecture, else "".
std::string gguf_architecture(const nn::WeightSource& w) {
  const auto* gguf = dynamic_cast<const nn::GgufWeights*>(&w);
  if (gguf == nullptr) return "";
  const auto arch = gguf->file().metadata_string("general.architecture");
  return arch ? " (a GGUF of general.architecture '" + *arch + "')" : "";
}

}  // namespace

bool is_qwen_image_single_file(const nn::WeightSource& w) {
  const std::string p = nn::MappedWeights::prefix_if_present(w, kComfyPrefix);
  for (const char* name : kSignature)
    if (!w.contains(p + name)) return false;
  return true;
}

QwenImageTransformerConfig infer_qwen_image_config(const nn::WeightSource& w) {
  const std::string p = nn::MappedWeights::prefix_if_present(w, kComfyPrefix);
  const auto shape_of = [&](const std::string& name, size_t dims) {
    KILN_CHECK(w.contains(p + name), w.description()
                                         << ": not a Qwen-Image transformer: no tensor '" << p + name << "'");
    const Shape shape = w.shape(p + name);
    KILN_CHECK(shape.size() == dims, w.description() << ": " << p + name << " should be " << dims
                                                     << "-d, got " << shape_str(shape));
    return shape;
  };
  QwenImageTransformerConfig c;
  const Shape img_in = shape_of("img_in.weight", 2);
  const int64_t inner = img_in[0];
  c.in_channels = img_in[1];
  c.joint_attention_dim = shape_of("txt_in.weight", 2)[1];
  const int64_t head_dim = shape_of("transformer_blocks.0.attn.norm_q.weight", 1)[0];
  KILN_CHECK(head_dim > 0 && inner % head_dim == 0, w.description()
                                                        << ": the q norm's width " << head_dim
                                                        << " does not divide the model width " << inner);
  c.attention_head_dim = head_dim;
  c.num_attention_heads = inner / head_dim;
  const Shape proj_out = shape_of("proj_out.weight", 2);
  KILN_CHECK(proj_out[0] % (c.patch_size * c.patch_size) == 0,
             w.description() << ": proj_out.weight " << shape_str(proj_out)
                             << " is not 2 x 2 patches of latent channels");
  c.out_channels = proj_out[0] / (c.patch_size * c.patch_size);
  c.num_layers = 0;
  while (w.contains(p + "transformer_blocks." + std::to_string(c.num_layers) + ".img_mod.1.weight"))
    ++c.num_layers;
  KILN_CHECK(head_dim == 128, w.description()
                                  << ": " << head_dim
                                  << "-wide heads: their RoPE axes cannot be read off the file; give a "
                                     "config.json (the transformer folder's) beside it");
  c.validate(w.description());
  return c;
}

std::unique_ptr<QwenImageTransformer2DModel> load_qwen_image_single_file(const std::string& path,
                                                                         const std::string& config,
                                                                         DType dtype) {
  std::shared_ptr<const nn::WeightSource> file = nn::open_weight_file(path);
  KILN_CHECK(is_qwen_image_single_file(*file),
             path << gguf_architecture(*file)
                  << ": not a Qwen-Image transformer (no img_in.weight, txt_norm.weight and "
                     "transformer_blocks.0.img_mod.1.weight, with or without model.diffusion_model.); a file "
                     "of another family?");
  const QwenImageTransformerConfig c =
      config.empty() ? infer_qwen_image_config(*file) : QwenImageTransformerConfig::from_file(config);
  auto model = std::make_unique<QwenImageTransformer2DModel>(c);
  // diffusers' names are the file's: every parameter maps to itself, under the prefix when the file has it.
  nn::MappingBuilder m;
  for (const auto& [name, shape] : model->parameter_shapes()) m.add(name, name);
  std::string prefix = nn::MappedWeights::prefix_if_present(*file, kComfyPrefix);
  nn::LoadOptions load;
  load.dtype = dtype;
  model->load_weights(
      nn::MappedWeights(std::move(file), std::move(m.entries), std::move(prefix), "Qwen-Image single file"),
      load);
  return model;
}

}  // namespace kiln::models
