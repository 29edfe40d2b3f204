// torch's CPU generator and randn, reproduced exactly. The pieces and where they come from in PyTorch:
//  * engine: at::mt19937 (ATen/core/MT19937RNGEngine.h), the reference MT19937 seeded with the low 32 bits;
//  * uniforms: at::uniform_real_distribution (24 random bits for float, 53 bits of random64() for double);
//  * n < 16 elements: at::normal_distribution<double>, a scalar Box-Muller that caches its sine half in the
//    generator; the double is then narrowed to the output dtype;
//  * n >= 16 elements: normal_fill (ATen/native/cpu/DistributionTemplates.h), uniforms for the whole tensor
//    first, then Box-Muller over pairs (j, j+8) of each block of 16. On x86 the float32 blocks run through
//    normal_fill_16_AVX2, whose log/sincos are the Cephes polynomials of avx_mathfun.h compiled with FMA
//    contraction; box_muller_block_f32() below performs the same float operations with the same fusions.
// The behaviours that are not visible in the float32 source but were measured on torch 2.15 are noted where
// they are implemented (bfloat16/float16 draws, tail blocks).
#include "kiln/pipelines/generator.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <numbers>

#include "kiln/core/error.h"
#include "kiln/core/half.h"

namespace kiln {

namespace {

constexpr int kStateSize = 624;
constexpr int kShift = 397;
constexpr uint32_t kMatrixA = 0x9908b0dfu;
constexpr uint32_t kUpperMask = 0x80000000u;
constexpr uint32_t kLowerMask = 0x7fffffffu;

// ---- avx_mathfun.h arithmetic, one lane at a time. std::fma is a single-rounding fused multiply-add on
// every target (hardware or glibc's exact emulation); this file is compiled without FMA code generation, so
// the plain `a * b + c` expressions below round twice, exactly like the unfused vector instructions.

float cephes_logf(float x) {
  x = std::max(x, std::bit_cast<float>(0x00800000u));  // smallest normal, as the kernel clamps
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  float e = static_cast<float>(static_cast<int32_t>(bits >> 23) - 0x7f);
  e = e + 1.0f;
  // Keep the mantissa, force the exponent of 0.5: x in [0.5, 1).
  x = std::bit_cast<float>((bits & ~0x7f800000u) | std::bit_cast<uint32_t>(0.5f));
  const bool below_sqrt_half = x < 0.707106781186547524f;
  const float tmp = below_sqrt_half ? x : 0.0f;
  x = x - 1.0f;
  e = e - (below_sqrt_half ? 1.0f : 0.0f);
  x = x + tmp;

  const float z = x * x;
  float y = 7.0376836292E-2f;
  y = std::fma(y, x, -1.1514610310E-1f);
  y = std::fma(y, x, 1.1676998740E-1f);
  y = std::fma(y, x, -1.2420140846E-1f);
  y = std::fma(y, x, 1.4249322787E-1f);
  y = std::fma(y, x, -1.6668057665E-1f);
  y = std::fma(y, x, 2.0000714765E-1f);
  y = std::fma(y, x, -2.4999993993E-1f);
  y = std::fma(y, x, 3.3333331174E-1f);
  y = y * x;
  y = std::fma(y, z, e * -2.12194440e-4f);
  y = std::fma(-z, 0.5f, y);
  x = x + y;
  x = std::fma(e, 0.693359375f, x);
  return x;
}

struct SinCos {
  float sin;
  float cos;
};

// sincos256_ps for theta >= 0 (Box-Muller angles are 2*pi*u with u in [0, 1)).
SinCos cephes_sincosf(float x) {
  const uint32_t sign_in = std::bit_cast<uint32_t>(x) & 0x80000000u;
  x = std::fabs(x);
  int32_t j = static_cast<int32_t>(x * 1.27323954473516f);  // truncation, like cvttps
  j = (j + 1) & ~1;
  const float y = static_cast<float>(j);
  const uint32_t swap_sign_sin = static_cast<uint32_t>(j & 4) << 29;
  const bool use_sin_poly = (j & 2) == 0;
  const uint32_t sign_cos = static_cast<uint32_t>(~(j - 2) & 4) << 29;
  const uint32_t sign_sin = sign_in ^ swap_sign_sin;

  // Extended-precision modular arithmetic: x - y * pi/4 in three parts.
  x = std::fma(y, -0.78515625f, x);
  x = std::fma(y, -2.4187564849853515625e-4f, x);
  x = std::fma(y, -3.77489497744594108e-8f, x);

  const float z = x * x;
  float c = std::fma(2.443315711809948E-5f, z, -1.388731625493765E-3f);
  c = std::fma(c, z, 4.166664568298827E-2f);
  c = c * z;
  c = std::fma(c, z, -(z * 0.5f));
  c = c + 1.0f;

  float s = std::fma(-1.9515295891E-4f, z, 8.3321608736E-3f);
  s = std::fma(s, z, -1.6666654611E-1f);
  s = s * z;
  s = std::fma(s, x, x);

  // The kernel selects with masks and adds the two masked halves, so a -0 result becomes +0; `+ 0.0f`
  // keeps that (the compiler may not fold it away without -fno-signed-zeros).
  const float sin_abs = (use_sin_poly ? s : c) + 0.0f;
  const float cos_abs = (use_sin_poly ? c : s) + 0.0f;
  return {std::bit_cast<float>(std::bit_cast<uint32_t>(sin_abs) ^ sign_sin),
          std::bit_cast<float>(std::bit_cast<uint32_t>(cos_abs) ^ sign_cos)};
}

// normal_fill_16_AVX2 with mean 0 and std 1, in place on 16 uniforms.
void box_muller_block_f32(float* d) {
  // _mm256_set1_ps(2.0f * c10::pi<double>): the product is a double, rounded once to float.
  constexpr float kTwoPi = static_cast<float>(2.0 * std::numbers::pi);
  for (int j = 0; j < 8; ++j) {
    const float u1 = 1.0f - d[j];  // [0, 1) -> (0, 1] for the log
    const float u2 = d[j + 8];
    const float radius = std::sqrt(-2.0f * cephes_logf(u1));
    const float theta = kTwoPi * u2;
    const SinCos sc = cephes_sincosf(theta);
    // The store is fma(n, std, mean) = n + 0, which only matters for -0.
    d[j] = radius * sc.cos + 0.0f;
    d[j + 8] = radius * sc.sin + 0.0f;
  }
}

// normal_fill_16<double>: the generic kernel with libm in double precision.
void box_muller_block_f64(double* d) {
  for (int j = 0; j < 8; ++j) {
    const double u1 = 1.0 - d[j];
    const double u2 = d[j + 8];
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * std::numbers::pi * u2;  // 2.0f * c10::pi<double> * u2, evaluated in double
    d[j] = radius * std::cos(theta) + 0.0;
    d[j + 8] = radius * std::sin(theta) + 0.0;
  }
}

// torch's normal_fill: uniforms for all n slots, Box-Muller per complete block of 16, and when n is not a
// multiple of 16 the last 16 slots get 16 fresh uniforms and are transformed again (n + 16 draws).
template <class T, class Uniform, class Block>
void normal_fill_with_tail(T* d, int64_t n, Uniform uniform, Block block) {
  for (int64_t i = 0; i < n; ++i) d[i] = uniform();
  for (int64_t i = 0; i + 16 <= n; i += 16) block(d + i);
  if (n % 16 != 0) {
    T* tail = d + n - 16;
    for (int i = 0; i < 16; ++i) tail[i] = uniform();
    block(tail);
  }
}

// bfloat16 / float16, n >= 16 (measured on torch 2.15; the values agree with the float32 kernel to the last
// bit before rounding): each block is drawn and transformed in float32 exactly as above, but a tail is
// handled differently from float32: the complete blocks are written, then ONE more block of 16 fresh uniforms
// is transformed and written to the last 16 slots. So 16 * ceil(n / 16) draws, and no uniform of the tail
// slots is drawn twice.
template <class T, class Convert>
void normal_fill_reduced(T* out, int64_t n, Generator& gen, Convert convert) {
  const int64_t full = n / 16;
  const int64_t blocks = full + (n % 16 != 0 ? 1 : 0);
  std::vector<float> buf(static_cast<size_t>(blocks * 16));
  for (auto& v : buf) v = gen.uniform_float();
  for (int64_t b = 0; b < blocks; ++b) box_muller_block_f32(buf.data() + b * 16);
  const int64_t head = n % 16 != 0 ? n - 16 : n;
  for (int64_t i = 0; i < head; ++i) out[i] = convert(buf[static_cast<size_t>(i)]);
  if (n % 16 != 0) {
    for (int64_t k = 0; k < 16; ++k) out[head + k] = convert(buf[static_cast<size_t>(full * 16 + k)]);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
Generator::Generator(uint64_t seed) {
  manual_seed(seed);
}

void Generator::manual_seed(uint64_t seed) {
  seed_ = seed;
  state_[0] = static_cast<uint32_t>(seed & 0xffffffffu);
  for (int j = 1; j < kStateSize; ++j) {
    state_[j] = 1812433253u * (state_[j - 1] ^ (state_[j - 1] >> 30)) + static_cast<uint32_t>(j);
  }
  left_ = 1;
  next_ = 0;
  next_double_normal_.reset();
}

// torch's CPUGeneratorImplState, byte offsets (x86-64 layout of CPUGeneratorImplStateLegacy and the float
// cache after it): the_initial_seed int64 0, left int32 8, seeded int32 12, next uint64 16, state uint64[624]
// 24, normal_x / normal_y / normal_rho double 5016 / 5024 / 5032, normal_is_valid int32 5040, then
// next_float_normal_sample float 5048 and is_next_float_normal_sample_valid bool 5052.
namespace {
constexpr size_t kSeedAt = 0, kLeftAt = 8, kSeededAt = 12, kNextAt = 16, kStateAt = 24, kNormalYAt = 5024,
                 kNormalValidAt = 5040, kFloatNormalValidAt = 5052;

template <class T>
T read_at(const uint8_t* bytes, size_t at) {
  T v;
  std::memcpy(&v, bytes + at, sizeof v);
  return v;
}
template <class T>
void write_at(std::vector<uint8_t>& bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
}
}  // namespace

Generator Generator::from_torch_state(const uint8_t* bytes, size_t size) {
  KILN_CHECK(size == kTorchStateBytes, "generator state: expected the "
                                           << kTorchStateBytes
                                           << " bytes of torch.Generator(\"cpu\")"
                                              ".get_state(), got "
                                           << size);
  Generator g;
  g.seed_ = read_at<uint64_t>(bytes, kSeedAt);
  const int32_t left = read_at<int32_t>(bytes, kLeftAt);
  const uint64_t next = read_at<uint64_t>(bytes, kNextAt);
  KILN_CHECK(read_at<int32_t>(bytes, kSeededAt) == 1, "generator state: the generator was never seeded");
  KILN_CHECK(left >= 1 && left <= kStateSize && next <= static_cast<uint64_t>(kStateSize) &&
                 next + static_cast<uint64_t>(left) <= static_cast<uint64_t>(kStateSize) + 1,
             "generator state: position left=" << left << ", next=" << next << " is not one MT19937 reaches");
  for (int i = 0; i < kStateSize; ++i) {
    const uint64_t word = read_at<uint64_t>(bytes, kStateAt + 8 * static_cast<size_t>(i));
    KILN_CHECK(word <= 0xffffffffu, "generator state: word " << i << " (" << word << ") exceeds 32 bits");
    g.state_[static_cast<size_t>(i)] = static_cast<uint32_t>(word);
  }
  g.left_ = left;
  g.next_ = static_cast<uint32_t>(next);
  const int32_t normal_valid = read_at<int32_t>(bytes, kNormalValidAt);
  KILN_CHECK(normal_valid == 0 || normal_valid == 1,
             "generator state: normal_is_valid is " << normal_valid << ", expected 0 or 1");
  if (normal_valid == 1) g.next_double_normal_ = read_at<double>(bytes, kNormalYAt);
  KILN_CHECK(
      bytes[kFloatNormalValidAt] == 0,
      "generator state: it holds a cached float32 normal sample, which Kiln's draws cannot continue from "
      "(torch's own float normal draws left it); pass a fresh generator or an int seed");
  return g;
}

std::vector<uint8_t> Generator::torch_state() const {
  std::vector<uint8_t> bytes(kTorchStateBytes, 0);
  write_at<uint64_t>(bytes, kSeedAt, seed_);
  write_at<int32_t>(bytes, kLeftAt, left_);
  write_at<int32_t>(bytes, kSeededAt, 1);
  write_at<uint64_t>(bytes, kNextAt, next_);
  for (int i = 0; i < kStateSize; ++i)
    write_at<uint64_t>(bytes, kStateAt + 8 * static_cast<size_t>(i), state_[static_cast<size_t>(i)]);
  if (next_double_normal_) {
    write_at<double>(bytes, kNormalYAt, *next_double_normal_);
    write_at<int32_t>(bytes, kNormalValidAt, 1);
  }
  return bytes;
}

void Generator::twist() {
  auto mix = [](uint32_t u, uint32_t v) {
    const uint32_t y = (u & kUpperMask) | (v & kLowerMask);
    return (y >> 1) ^ ((v & 1u) ? kMatrixA : 0u);
  };
  for (int k = 0; k < kStateSize; ++k) {
    state_[k] = state_[(k + kShift) % kStateSize] ^ mix(state_[k], state_[(k + 1) % kStateSize]);
  }
  left_ = kStateSize;
  next_ = 0;
}

uint32_t Generator::random() {
  if (--left_ == 0) twist();
  uint32_t y = state_[next_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t Generator::random64() {
  const uint64_t hi = random();
  const uint64_t lo = random();
  return (hi << 32) | lo;
}

float Generator::uniform_float() {
  return static_cast<float>(random() & ((1u << 24) - 1)) * 0x1p-24f;
}

double Generator::uniform_double() {
  return static_cast<double>(random64() & ((uint64_t{1} << 53) - 1)) * 0x1p-53;
}

double Generator::normal_double() {
  if (next_double_normal_) {
    const double cached = *next_double_normal_;
    next_double_normal_.reset();
    return cached + 0.0;
  }
  const double u1 = uniform_double();
  const double u2 = uniform_double();
  const double r = std::sqrt(-2.0 * std::log1p(-u2));
  const double theta = 2.0 * std::numbers::pi * u1;
  next_double_normal_ = r * std::sin(theta);
  return r * std::cos(theta) + 0.0;
}

// ---------------------------------------------------------------------------------------------------------
Tensor randn(const Shape& shape, DType dtype, Generator& gen) {
  for (int64_t d : shape) {
    KILN_CHECK(d >= 0, "randn: expected non-negative sizes, got shape " << shape_str(shape));
  }
  KILN_CHECK(dtype == float32 || dtype == bfloat16 || dtype == float16 || dtype == float64,
             "randn: expected dtype float32, bfloat16, float16 or float64, got " << dtype_name(dtype));
  Tensor out = Tensor::empty(shape, dtype);
  const int64_t n = out.numel();
  if (n == 0) return out;

  if (n < 16) {
    // The serial kernel: one double normal per element, narrowed like static_cast<scalar_t>(double). For the
    // 16-bit types c10 goes through float first (double -> float -> bf16/f16, two roundings).
    visit_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16_t> ||
                    std::is_same_v<T, f16_t>) {
        T* p = out.data<T>();
        for (int64_t i = 0; i < n; ++i) p[i] = scalar_from_double<T>(gen.normal_double());
      }
    });
    return out;
  }

  switch (dtype) {
    case DType::Float32:
      normal_fill_with_tail(
          out.data<float>(), n, [&] { return gen.uniform_float(); }, box_muller_block_f32);
      break;
    case DType::Float64:
      normal_fill_with_tail(
          out.data<double>(), n, [&] { return gen.uniform_double(); }, box_muller_block_f64);
      break;
    case DType::BFloat16:
      normal_fill_reduced(out.data<bf16_t>(), n, gen, f32_to_bf16);
      break;
    case DType::Float16:
      normal_fill_reduced(out.data<f16_t>(), n, gen, f32_to_f16);
      break;
    default:
      break;  // rejected above
  }
  return out;
}

Tensor randn_tensor(const Shape& shape, Generator& gen, DType dtype) {
  return randn(shape, dtype, gen);
}

Tensor randn_tensor(const Shape& shape, const std::vector<Generator*>& gens, DType dtype) {
  KILN_CHECK(!gens.empty(), "randn_tensor: expected at least one generator, got an empty list");
  for (size_t i = 0; i < gens.size(); ++i) {
    KILN_CHECK(gens[i] != nullptr, "randn_tensor: generator " << i << " of " << gens.size() << " is null");
  }
  if (gens.size() == 1) return randn(shape, dtype, *gens[0]);
  KILN_CHECK(!shape.empty() && shape[0] == static_cast<int64_t>(gens.size()),
             "randn_tensor: a list of " << gens.size()
                                        << " generators needs one generator per batch element, got shape "
                                        << shape_str(shape));
  Shape one = shape;
  one[0] = 1;
  Tensor out = Tensor::empty(shape, dtype);
  for (size_t i = 0; i < gens.size(); ++i) {
    out.narrow(0, static_cast<int64_t>(i), 1).copy_(randn(one, dtype, *gens[i]));
  }
  return out;
}

}  // namespace kiln
