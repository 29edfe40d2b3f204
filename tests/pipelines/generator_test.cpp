// Generator / randn / randn_tensor against torch (tools/refs/generator.py ->
// tests/data/refs/generator.safetensors). Every comparison is bit-exact: the point of the generator is that a
// seed gives diffusers' noise exactly.
#include "kiln/pipelines/generator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "kiln/core/device_runtime.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const io::SafetensorsFile& refs() {
  static const io::SafetensorsFile file(testing::data_path("refs/generator.safetensors"));
  return file;
}

uint64_t seed_of(const Tensor& t, int64_t row = 0) {
  const auto v = t.to_vector<int64_t>();
  return (static_cast<uint64_t>(v[2 * row]) << 32) | static_cast<uint64_t>(v[2 * row + 1]);
}

uint64_t fnv1a64(const Tensor& t) {
  const Tensor c = t.contiguous();
  synchronize();  // raw_data() does not wait for the copy
  const auto* p = static_cast<const unsigned char*>(c.raw_data());
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// Bitwise comparison of two tensors of the same dtype; reports the first differing flat index.
::testing::AssertionResult bits_equal(const Tensor& actual, const Tensor& expected) {
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(actual.dtype()) << " vs " << dtype_name(expected.dtype());
  if (actual.numel() != expected.numel())
    return ::testing::AssertionFailure() << "numel " << actual.numel() << " vs " << expected.numel();
  const Tensor a = actual.contiguous(), e = expected.contiguous();
  synchronize();  // raw_data() does not wait for the copies
  const size_t es = a.element_size();
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pe = static_cast<const unsigned char*>(e.raw_data());
  const auto av = a.to_vector<double>(), ev = e.to_vector<double>();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + i * es, pe + i * es, es) != 0) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.numel() << " values differ; first at " << first
                                       << ": " << av[first] << " vs expected " << ev[first];
}

// Replays every "<case>.seed" case of the reference file: the draws of a case come from one generator.
TEST(GeneratorRefs, AllCasesBitExact) {
  const auto& f = refs();
  int cases = 0, draws = 0;
  for (const auto& name : f.names()) {
    const std::string suffix = ".seed";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string c = name.substr(0, name.size() - suffix.size());
    if (c == "list") continue;
    ++cases;
    Generator gen(seed_of(f.tensor(name)));
    for (int k = 0; f.contains(c + "." + std::to_string(k) + ".spec"); ++k) {
      const std::string d = c + "." + std::to_string(k);
      SCOPED_TRACE(d);
      const auto spec = f.tensor(d + ".spec").to_vector<int64_t>();
      const Shape shape(spec.begin() + 2, spec.end());
      ASSERT_EQ(static_cast<int64_t>(shape.size()), spec[1]);
      const Tensor expected = f.tensor(d + ".expected");
      Tensor actual;
      if (spec[0] == 0) {
        actual = randn(shape, expected.dtype(), gen);
      } else {
        // torch.rand: one uniform per element in the generator's float / double resolution.
        actual = Tensor::empty(shape, expected.dtype());
        if (expected.dtype() == float32) {
          float* p = actual.data<float>();
          for (int64_t i = 0; i < actual.numel(); ++i) p[i] = gen.uniform_float();
        } else {
          ASSERT_EQ(expected.dtype(), float64);
          double* p = actual.data<double>();
          for (int64_t i = 0; i < actual.numel(); ++i) p[i] = gen.uniform_double();
        }
      }
      ++draws;
      EXPECT_EQ(actual.shape(), shape);
      EXPECT_EQ(actual.dtype(), expected.dtype());
      EXPECT_EQ(fnv1a64(actual), static_cast<uint64_t>(f.tensor(d + ".hash").to_vector<int64_t>()[0]));
      // from_blob rather than reshape: reshape of a 0-dim tensor to [1] is rejected by the core view code.
      const Tensor dense = actual.contiguous();
      synchronize();  // raw_data() does not wait for the copy
      const Tensor flat = Tensor::from_blob(dense.raw_data(), {actual.numel()}, actual.dtype());
      if (f.contains(d + ".index")) {
        const auto idx = f.tensor(d + ".index").to_vector<int64_t>();
        Tensor picked = Tensor::empty({static_cast<int64_t>(idx.size())}, actual.dtype());
        for (size_t i = 0; i < idx.size(); ++i)
          picked.narrow(0, static_cast<int64_t>(i), 1).copy_(flat.narrow(0, idx[i], 1));
        EXPECT_TRUE(bits_equal(picked, expected));
      } else {
        EXPECT_TRUE(bits_equal(flat, expected));
      }
    }
  }
  // The file holds ~120 cases; make sure the loop did not silently find none.
  EXPECT_GT(cases, 100);
  EXPECT_GT(draws, 130);
}

TEST(GeneratorRefs, RandnTensorGeneratorList) {
  const auto& f = refs();
  const Tensor seeds = f.tensor("list.seeds");
  const auto shape_v = f.tensor("list.shape").to_vector<int64_t>();
  const Shape shape(shape_v.begin(), shape_v.end());
  std::vector<Generator> gens;
  for (int64_t i = 0; i < seeds.size(0); ++i) gens.emplace_back(seed_of(seeds, i));
  std::vector<Generator*> ptrs;
  for (auto& g : gens) ptrs.push_back(&g);
  const Tensor first = randn_tensor(shape, ptrs, bfloat16);
  EXPECT_EQ(first.shape(), shape);
  EXPECT_TRUE(bits_equal(first, f.tensor("list.expected")));
  EXPECT_TRUE(bits_equal(randn_tensor(shape, ptrs, bfloat16), f.tensor("list.expected_second")));
  // Element 0 of the batch is what its generator alone draws for one batch element.
  Generator g0(seed_of(seeds, 0));
  Shape one = shape;
  one[0] = 1;
  EXPECT_TRUE(bits_equal(randn(one, bfloat16, g0), first.narrow(0, 0, 1)));
}

// torch.Generator's get_state() bytes part-way through a stream (tools/refs/generator_states.py): Kiln picks
// up where torch stopped (the draws that follow are torch's, bit for bit), and hands back torch's bytes.
TEST(GeneratorRefs, ContinuesFromTorchsStateAndHandsItBack) {
  const io::SafetensorsFile file(testing::data_path("refs/generator_states.safetensors"));
  for (const char* name : {"fresh", "cached_normal", "mid_stream", "after_twists"}) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> state = file.tensor(std::string("state_") + name).to_vector<uint8_t>();
    Generator g = Generator::from_torch_state(state.data(), state.size());
    EXPECT_EQ(g.torch_state(), state);
    for (int i = 0;; ++i) {
      const std::string key = std::string("draws_") + name + "_" + std::to_string(i);
      if (!file.contains(key)) break;
      const Tensor want = file.tensor(key);
      EXPECT_TRUE(bits_equal(randn(want.shape(), want.dtype(), g), want)) << key;
    }
    EXPECT_EQ(g.torch_state(), file.tensor(std::string("state_after_") + name).to_vector<uint8_t>());
  }
}

TEST(Generator, TorchStatesOutOfRangeAreNamed) {
  const std::vector<uint8_t> fresh = Generator(3).torch_state();
  ASSERT_EQ(fresh.size(), Generator::kTorchStateBytes);
  const auto expect_error = [](std::vector<uint8_t> bytes, const std::string& words) {
    try {
      Generator::from_torch_state(bytes.data(), bytes.size());
      ADD_FAILURE() << "accepted: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error(std::vector<uint8_t>(fresh.begin(), fresh.end() - 1), "expected the 5056 bytes");
  std::vector<uint8_t> bad = fresh;
  bad[8] = 0;  // left = 0
  expect_error(bad, "is not one MT19937 reaches");
  bad = fresh;
  bad[24 + 4] = 1;  // the first word's high half
  expect_error(bad, "exceeds 32 bits");
  bad = fresh;
  bad[5052] = 1;
  expect_error(bad, "cached float32 normal");
  bad = fresh;
  bad[12] = 0;
  expect_error(bad, "never seeded");
}

TEST(Generator, MatchesStdMt19937AndTorchSeeding) {
  // at::mt19937 is the reference MT19937 seeded with the low 32 bits of the seed.
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, (uint64_t{1} << 32) + 5, ~uint64_t{0}}) {
    Generator g(seed);
    std::mt19937 ref(static_cast<uint32_t>(seed));
    EXPECT_EQ(g.initial_seed(), seed);
    for (int i = 0; i < 2000; ++i) ASSERT_EQ(g.random(), ref()) << "seed " << seed << " draw " << i;
    const uint64_t hi = ref(), lo = ref();
    EXPECT_EQ(g.random64(), (hi << 32) | lo);
  }
}

TEST(Generator, ManualSeedResetsStreamAndSpare) {
  Generator g(3);
  const Tensor a = randn({3}, float32, g);  // leaves a cached normal
  g.manual_seed(3);
  const Tensor b = randn({3}, float32, g);
  EXPECT_TRUE(bits_equal(a, b));
  // Draws without reseeding continue the stream instead.
  const Tensor c = randn({3}, float32, g);
  EXPECT_FALSE(bits_equal(b, c));
}

TEST(Generator, DefaultSeedIsTorchDefault) {
  Generator g;
  EXPECT_EQ(g.initial_seed(), 67280421310721ull);
}

TEST(Generator, RejectsBadArguments) {
  Generator g(0);
  for (DType bad : {int64, int32, boolean, uint8}) {
    try {
      randn({4}, bad, g);
      ADD_FAILURE() << "randn accepted " << dtype_name(bad);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("randn"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(randn({2, -1}, float32, g), Error);
  Generator h(1);
  EXPECT_THROW(randn_tensor({3, 4}, std::vector<Generator*>{&g, &h}, float32),
               Error);  // 2 generators, batch 3
  EXPECT_THROW(randn_tensor({2, 4}, std::vector<Generator*>{}, float32), Error);
  EXPECT_THROW(randn_tensor({2, 4}, std::vector<Generator*>{&g, nullptr}, float32), Error);
  try {
    randn_tensor({3, 4}, std::vector<Generator*>{&g, &h}, float32);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("randn_tensor"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3, 4]"), std::string::npos) << e.what();
  }
}

TEST(Generator, EmptyShapeDrawsNothing) {
  Generator g(9), ref(9);
  EXPECT_EQ(randn({0, 5}, bfloat16, g).numel(), 0);
  EXPECT_EQ(g.random(), ref.random());
}

}  // namespace
}  // namespace kiln
