#include "families/z_image/z_image_single_file.h"

#include "kiln/core/error.h"
#include "kiln/nn/mapped_weights.h"

namespace kiln::models {

namespace {

constexpr const char* kComfyPrefix = "model.diffusion_model.";

std::string replaced(std::string name, const std::string& from, const std::string& to) {
  const size_t at = name.find(from);
  if (at != std::string::npos) name.replace(at, from.size(), to);
  return name;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

int64_t count_blocks(const nn::WeightSource& w, const std::string& prefix, const std::string& list) {
  int64_t count = 0;
  while (w.contains(prefix + list + "." + std::to_string(count) + ".attention.qkv.weight")) ++count;
  return count;
}

}  // namespace

bool is_z_image_single_file(const nn::WeightSource& w) {
  const std::string p = nn::MappedWeights::prefix_if_present(w, kComfyPrefix);
  return w.contains(p + "layers.0.adaLN_modulation.0.weight") &&
         w.contains(p + "layers.0.attention.qkv.weight");
}

std::unique_ptr<nn::WeightSource> z_image_single_file_weights(std::shared_ptr<const nn::WeightSource> inner,
                                                              const ZImageTransformerConfig& config) {
  // Every parameter of the model, under the name the original layout gives it.
  ZImageTransformer2DModel model(config);
  const std::string patch =
      std::to_string(config.patch_size()) + "-" + std::to_string(config.all_f_patch_size.front());
  const int64_t dim = config.dim;
  nn::MappingBuilder m;
  for (const auto& [name, shape] : model.parameter_shapes()) {
    std::string original = replaced(name, "all_x_embedder." + patch + ".", "x_embedder.");
    original = replaced(original, "all_final_layer." + patch + ".", "final_layer.");
    original = replaced(original, ".attention.to_out.0.", ".attention.out.");
    original = replaced(original, ".attention.norm_q.", ".attention.q_norm.");
    original = replaced(original, ".attention.norm_k.", ".attention.k_norm.");
    int64_t part = -1;
    for (int64_t k = 0; k < 3; ++k)
      if (ends_with(name, std::string(".attention.to_") + "qkv"[k] + ".weight")) part = k;
    if (part < 0) {
      m.add(name, original);
    } else {
      // torch.chunk(qkv, 3, dim=0): q, k, v rows in that order.
      m.add(name, original.substr(0, original.size() - std::string("to_q.weight").size()) + "qkv.weight",
            part * dim, (part + 1) * dim);
    }
  }
  std::string prefix = nn::MappedWeights::prefix_if_present(*inner, kComfyPrefix);
  return std::make_unique<nn::MappedWeights>(std::move(inner), std::move(m.entries), std::move(prefix),
                                             "Z-Image single file (the original layout)");
}

std::vector<std::string> z_image_single_file_ignored(const nn::WeightSource& w) {
  // Files saved by ComfyUI hold its NextDiT's unused norm_final (diffusers drops it).
  return {nn::MappedWeights::prefix_if_present(w, kComfyPrefix) + "norm_final."};
}

ZImageTransformerConfig infer_z_image_config(const nn::WeightSource& w) {
  const std::string p = nn::MappedWeights::prefix_if_present(w, kComfyPrefix);
  KILN_CHECK(is_z_image_single_file(w), w.description()
                                            << ": not a Z-Image transformer in the original layout: no "
                                               "tensors '"
                                            << p << "layers.0.adaLN_modulation.0.weight' and '" << p
                                            << "layers.0.attention.qkv.weight'");
  const auto shape_of = [&](const std::string& name, size_t dims) {
    KILN_CHECK(w.contains(p + name), w.description()
                                         << ": not a Z-Image transformer in the original layout: no "
                                            "tensor '"
                                         << p + name << "'");
    const Shape shape = w.shape(p + name);
    KILN_CHECK(shape.size() == dims, w.description() << ": " << p + name << " should be " << dims
                                                     << "-d, got " << shape_str(shape));
    return shape;
  };
  ZImageTransformerConfig c;
  c.axes_lens = {1536, 512, 512};  // Z-Image-Turbo's config (diffusers' default is 1024 for the first axis)
  const Shape x_embedder = shape_of("x_embedder.weight", 2);
  c.dim = x_embedder[0];
  const int64_t patch = c.patch_size();
  KILN_CHECK(x_embedder[1] % (patch * patch) == 0, w.description()
                                                       << ": x_embedder.weight " << shape_str(x_embedder)
                                                       << " is not 2x2 patches of channels");
  c.in_channels = x_embedder[1] / (patch * patch);
  c.cap_feat_dim = shape_of("cap_embedder.1.weight", 2)[1];
  const int64_t head_dim = shape_of("layers.0.attention.q_norm.weight", 1)[0];
  KILN_CHECK(head_dim > 0 && c.dim % head_dim == 0, w.description()
                                                        << ": the q norm's width " << head_dim
                                                        << " does not divide the model width " << c.dim);
  c.n_heads = c.n_kv_heads = c.dim / head_dim;
  const Shape qkv = shape_of("layers.0.attention.qkv.weight", 2);
  KILN_CHECK(qkv[0] == 3 * c.dim && qkv[1] == c.dim,
             w.description() << ": layers.0.attention.qkv.weight is " << shape_str(qkv) << ", expected ["
                             << 3 * c.dim << ", " << c.dim
                             << "] (q, k and v of every head: a grouped-key model such as Lumina 2 "
                                "is another family)");
  c.n_layers = count_blocks(w, p, "layers");
  c.n_refiner_layers = count_blocks(w, p, "noise_refiner");
  KILN_CHECK(count_blocks(w, p, "context_refiner") == c.n_refiner_layers,
             w.description() << ": " << c.n_refiner_layers << " noise_refiner blocks but "
                             << count_blocks(w, p, "context_refiner") << " context_refiner blocks");
  KILN_CHECK(head_dim == 128, w.description()
                                  << ": " << head_dim
                                  << "-wide heads: their RoPE axes cannot be read off the file; give a "
                                     "config.json (the transformer folder's) beside it");
  c.validate(w.description());
  return c;
}

}  // namespace kiln::models
