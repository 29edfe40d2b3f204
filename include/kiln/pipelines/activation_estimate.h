// What a call's activations hold at once, estimated from its shapes before it runs: what a memory budget
// on a device (set_memory_budget(bytes, device), kiln generate --device ... --max-memory) keeps free beside
// the weights it lets in. The estimate counts as strict eager does: each op's output alive until its last
// reader, and the attention scores materialised (tokens^2 per head, in float32, and the probabilities)
// wherever the device does not fuse attention. Stages run one after another, so the call's estimate is its
// largest stage's.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"

namespace kiln {

namespace models {
class AutoencoderKL;
}

struct ActivationEstimate {
  int64_t height = 0, width = 0;  // the image the call makes
  int64_t text_encoders = 0;      // the largest text encoder's forward
  int64_t transformer = 0;        // one denoising step (its batch: images, times two under batched guidance)
  int64_t vae = 0;                // the decode (or an encode of the call's images), tiled when tiling is on
  int64_t peak() const;
  // "up to 2.0 GiB of activations at 1024x1024 (text encoders 70.0 MiB, transformer 622 MiB, VAE 2.0 GiB)"
  std::string describe() const;
};

// A stack of transformer blocks over `tokens` tokens: the widths of its residual stream, its MLP's hidden
// layer and its attention heads.
struct BlockStackShape {
  int64_t batch = 1;
  int64_t tokens = 0;
  int64_t width = 0;
  int64_t mlp_width = 0;
  int64_t heads = 1;
  // The device runs attention as one fused kernel (cuDNN's on cuda): no scores are materialised.
  bool fused_attention = false;
  // The device runs attention as a loop over blocks of this many keys (a TPU's): one block's scores are
  // materialised at a time; 0: all of them.
  int64_t attention_key_block = 0;
};
int64_t block_stack_activation_bytes(const BlockStackShape& shape, DType dtype);

// Whether attention of `head_dim` in `dtype` runs as one fused kernel on `device`, as its backend says
// (runtime::Backend::fuses_attention): cuDNN's flash attention on cuda for 16-bit types and head dims that
// are multiples of 8 up to 128, unless KILN_PJRT_FUSED_ATTENTION=0.
bool fuses_attention(const Device& device, DType dtype, int64_t head_dim);
// The keys per block of attention (without a bias) of `head_dim` in `dtype` on `device`, as its backend says
// (runtime::Backend::attention_key_block): 256 on a TPU (KILN_PJRT_ATTENTION_KEY_BLOCK sets it), 0 where
// attention holds all its scores or none.
int64_t attention_key_block(const Device& device, DType dtype, int64_t head_dim);

// The VAE's decode of a batch x height x width image on `device` (or its encode, which holds less), by the
// widest activation of its convolutions (at the resolution they run) and its mid-block attention over the
// latent's pixels; with tiling on, the tile's size.
int64_t vae_activation_bytes(const models::AutoencoderKL& vae, int64_t batch, int64_t height, int64_t width,
                             DType dtype, const Device& device = cpu);

}  // namespace kiln
