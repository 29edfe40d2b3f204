#include "kiln/pipelines/activation_estimate.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "kiln/core/bytes.h"
#include "kiln/models/autoencoder_kl.h"
#include "pipelines/encoder_activations.h"
#include "runtime/backend.h"

namespace kiln {

namespace {

// Attention over `tokens` keys for `queries` queries per head, composed of plain ops: the scores in float32
// and the probabilities in the activations' dtype.
int64_t attention_scores_bytes(int64_t batch, int64_t heads, int64_t queries, int64_t keys, DType dtype) {
  return batch * heads * queries * keys * (4 + static_cast<int64_t>(dtype_size(dtype)));
}

}  // namespace

int64_t ActivationEstimate::peak() const {
  return std::max({text_encoders, transformer, vae});
}

std::string ActivationEstimate::describe() const {
  std::ostringstream s;
  s << "up to " << format_bytes(peak()) << " of activations at " << width << "x" << height
    << " (text encoders " << format_bytes(text_encoders) << ", transformer " << format_bytes(transformer)
    << ", VAE " << format_bytes(vae) << ")";
  return s.str();
}

bool fuses_attention(const Device& device, DType dtype, int64_t head_dim) {
  return runtime::backend_for(device.type).fuses_attention(device.type, dtype, head_dim);
}

int64_t attention_key_block(const Device& device, DType dtype, int64_t head_dim) {
  return runtime::backend_for(device.type).attention_key_block(device.type, dtype, head_dim);
}

int64_t block_stack_activation_bytes(const BlockStackShape& shape, DType dtype) {
  const int64_t e = static_cast<int64_t>(dtype_size(dtype));
  // Inside a block at its widest: the input, its norm and modulation, q, k, v and their rotated copies, the
  // attention's output and the stream it is added to (about ten widths), and the MLP's hidden layer, its
  // activation and a gate or concatenation beside it (three MLP widths).
  const int64_t streams = shape.batch * shape.tokens * (10 * shape.width + 3 * shape.mlp_width) * e;
  const int64_t held_keys =
      shape.attention_key_block > 0 ? std::min(shape.tokens, shape.attention_key_block) : shape.tokens;
  const int64_t scores = shape.fused_attention ? 0
                                               : attention_scores_bytes(shape.batch, shape.heads,
                                                                        shape.tokens, held_keys, dtype);
  return streams + scores;
}

namespace {

int64_t untiled_vae_bytes(const models::AutoencoderKLConfig& c, int64_t batch, int64_t height, int64_t width,
                          DType dtype, const Device& device) {
  const int64_t e = static_cast<int64_t>(dtype_size(dtype));
  const int64_t f = c.scale_factor();
  const std::vector<int64_t>& channels = c.decoder_channels();
  // The decoder's up blocks run from the latent's resolution to the image's, the deepest channels first; the
  // block at each resolution reads the previous block's output, upsampled. A convolution's input, its
  // output, a norm's and the residual beside them, and the scratch of the program that convolves (on a
  // device, XLA's temporaries: about one more): five of the widest (channels x pixels) at once.
  int64_t widest = 0;
  const auto levels = static_cast<int64_t>(channels.size());
  for (int64_t level = 0; level < levels; ++level) {
    const int64_t scale = f >> (levels - 1 - level);  // pixels per latent pixel at this level
    const int64_t in = channels[static_cast<size_t>(std::min(levels - 1, levels - level))];
    const int64_t out = channels[static_cast<size_t>(levels - 1 - level)];
    widest = std::max(widest, std::max(in, out) * (height / f * scale) * (width / f * scale));
  }
  const int64_t convolutions = 5 * batch * widest * e;
  // The mid block's attention: one head over the latent's pixels, as wide as the deepest channels.
  const int64_t latent_pixels = (height / f) * (width / f);
  const int64_t key_block = attention_key_block(device, dtype, channels.back());
  const int64_t held_keys = key_block > 0 ? std::min(latent_pixels, key_block) : latent_pixels;
  const int64_t attention = c.mid_block_add_attention
                                ? attention_scores_bytes(batch, 1, latent_pixels, held_keys, dtype) +
                                      5 * batch * latent_pixels * channels.back() * e
                                : 0;
  return std::max(convolutions, attention);
}

}  // namespace

int64_t vae_activation_bytes(const models::AutoencoderKL& vae, int64_t batch, int64_t height, int64_t width,
                             DType dtype, const Device& device) {
  const models::AutoencoderKLConfig& c = vae.config();
  if (!vae.use_tiling()) return untiled_vae_bytes(c, batch, height, width, dtype, device);
  // A tile at a time, and the blended image beside it.
  const int64_t tile = vae.tiling().tile_sample_min_size;
  return untiled_vae_bytes(c, batch, std::min(height, tile), std::min(width, tile), dtype, device) +
         batch * c.out_channels * height * width * static_cast<int64_t>(dtype_size(dtype));
}

}  // namespace kiln

namespace kiln::pipelines {

int64_t t5_activation_bytes(const models::T5EncoderConfig& config, int64_t tokens, DType dtype) {
  return block_stack_activation_bytes({.tokens = tokens,
                                       .width = std::max(config.d_model, config.num_heads * config.d_kv),
                                       .mlp_width = config.d_ff,
                                       .heads = config.num_heads,
                                       .fused_attention = false},  // T5 adds a position bias to the scores
                                      dtype);
}

int64_t clip_activation_bytes(const models::ClipTextConfig& config, DType dtype, const Device& device) {
  const int64_t head_dim = config.hidden_size / std::max<int64_t>(config.num_attention_heads, 1);
  return block_stack_activation_bytes({.tokens = config.max_position_embeddings,
                                       .width = config.hidden_size,
                                       .mlp_width = config.intermediate_size,
                                       .heads = config.num_attention_heads,
                                       .fused_attention = fuses_attention(device, dtype, head_dim),
                                       .attention_key_block = attention_key_block(device, dtype, head_dim)},
                                      dtype);
}

int64_t dit_step_activation_bytes(int64_t batch, int64_t tokens, int64_t heads, int64_t head_dim, DType dtype,
                                  const Device& device) {
  return block_stack_activation_bytes({.batch = batch,
                                       .tokens = tokens,
                                       .width = heads * head_dim,
                                       .mlp_width = 4 * heads * head_dim,
                                       .heads = heads,
                                       .fused_attention = fuses_attention(device, dtype, head_dim),
                                       .attention_key_block = attention_key_block(device, dtype, head_dim)},
                                      dtype);
}

}  // namespace kiln::pipelines
