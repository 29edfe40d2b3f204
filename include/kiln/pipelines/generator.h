// Generator: PyTorch's CPU random number generator, reproduced bit for bit, so that a seed gives Kiln the
// same initial noise (and therefore the same image) as `torch.Generator("cpu").manual_seed(seed)` gives
// diffusers. randn() reproduces `torch.randn(shape, generator=g, dtype=dtype)` on an x86 build of torch
// (the AVX2 Box-Muller kernel that torch also runs on AVX-512 machines), for float32, bfloat16, float16 and
// float64, including how successive calls continue the stream. randn_tensor() is diffusers'
// `utils.torch_utils.randn_tensor` (one generator, or one generator per batch element).
//
// Checked against torch 2.15 (tools/refs/generator.py). Older torch versions (1.13 to at least 2.7) computed
// bfloat16/float16 noise in 16-bit arithmetic from 8/11-bit uniforms; those draws are not reproduced.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln {

class Generator {
 public:
  // torch's default CPU seed (c10::detail::default_rng_seed_val), used when no seed is given.
  static constexpr uint64_t kDefaultSeed = 67280421310721ull;

  explicit Generator(uint64_t seed = kDefaultSeed);

  // Re-seeds like `Generator.manual_seed`: MT19937 init from the low 32 bits, cached normal spare cleared.
  void manual_seed(uint64_t seed);
  // The seed last given (all 64 bits, like `Generator.initial_seed()`).
  uint64_t initial_seed() const { return seed_; }

  // torch.Generator("cpu").get_state() / set_state(): the 5056 bytes of torch's CPUGeneratorImplState (the
  // MT19937 words, its position, the cached normal). A generator that has drawn numbers continues where
  // torch's would. Bytes of another size or out of range, or with a cached float32 normal (which Kiln's draws
  // never use), are an error naming what is wrong.
  static constexpr size_t kTorchStateBytes = 5056;
  static Generator from_torch_state(const uint8_t* bytes, size_t size);
  std::vector<uint8_t> torch_state() const;

  // One tempered 32-bit MT19937 output (torch's `random()`).
  uint32_t random();
  // Two outputs, the first in the high word (torch's `random64()`).
  uint64_t random64();
  // Uniform [0, 1) like at::uniform_real_distribution: 24 random bits for float, 53 for double.
  float uniform_float();
  double uniform_double();
  // One standard normal from torch's scalar Box-Muller (at::normal_distribution<double>): draws a pair,
  // returns the cosine half and caches the sine half for the next call.
  double normal_double();

 private:
  void twist();

  std::array<uint32_t, 624> state_{};
  int left_ = 1;
  uint32_t next_ = 0;
  uint64_t seed_ = 0;
  std::optional<double> next_double_normal_;
};

// torch.randn(shape, generator=gen, dtype=dtype) on the CPU. Supported dtypes: float32, bfloat16, float16,
// float64; anything else throws kiln::Error.
Tensor randn(const Shape& shape, DType dtype, Generator& gen);

// diffusers' randn_tensor with a single generator: one randn call for the whole batch.
Tensor randn_tensor(const Shape& shape, Generator& gen, DType dtype);
// diffusers' randn_tensor with a list of generators: batch element i is drawn with shape [1, shape[1:]...]
// from gens[i]. The list must have one generator per batch element (shape[0]); a list of one generator is
// the single-generator case.
Tensor randn_tensor(const Shape& shape, const std::vector<Generator*>& gens, DType dtype);

}  // namespace kiln
