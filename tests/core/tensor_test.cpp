#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/device_runtime.h"
#include "kiln/core/tensor.h"
#include "support/test_data.h"

namespace kiln {
namespace {

TEST(Tensor, ContiguousStridesAndNumel) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.strides(), (Strides{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 96u);
}

TEST(Tensor, PermuteSliceExpandAreViews) {
  Tensor t = Tensor::arange(24, float32).view({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_EQ(p.storage(), t.storage());
  // p[1][1][2] = t[1][2][1] = 1*12 + 2*4 + 1 = 21
  EXPECT_EQ(p.select(0, 1).select(0, 1).select(0, 2).item(), 21.0);
  Tensor s = t.slice(2, 1, 4, 2);  // columns 1 and 3
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.contiguous().to_vector<float>()[0], 1.0f);
  EXPECT_EQ(s.contiguous().to_vector<float>()[1], 3.0f);
  Tensor e = Tensor::arange(3, float32).view({3, 1}).expand({3, 5});
  EXPECT_EQ(e.strides(), (Strides{1, 0}));
  const auto v = e.contiguous().to_vector<float>();
  EXPECT_EQ(v[4], 0.0f);
  EXPECT_EQ(v[5], 1.0f);
  EXPECT_EQ(v[14], 2.0f);
}

// permute(...).contiguous() whose source is contiguous along an outer output dimension runs as a tiled
// transpose (copy.cpp): every element lands where the strided walk puts it, across partial tiles, batch
// dimensions on either side of the transposed pair, threads, and a dtype conversion on the way.
TEST(Tensor, TransposingCopiesPutEveryElementInPlace) {
  const Shape shape{3, 70, 37, 41};
  const Tensor t = Tensor::arange(3 * 70 * 37 * 41, float32).view(shape);
  const Strides st = t.strides();
  const std::vector<float> t_rounded = t.to(bfloat16).to_vector<float>();
  for (const std::vector<int64_t>& order :
       std::vector<std::vector<int64_t>>{{0, 3, 1, 2}, {3, 0, 2, 1}, {1, 3, 0, 2}, {3, 2, 1, 0}}) {
    const Tensor p = t.permute(order);
    const std::vector<float> got = p.contiguous().to_vector<float>();
    const std::vector<float> rounded = p.to(bfloat16).to_vector<float>();
    ASSERT_EQ(got.size(), static_cast<size_t>(t.numel()));
    int64_t i = 0;
    for (int64_t a = 0; a < p.size(0); ++a)
      for (int64_t b = 0; b < p.size(1); ++b)
        for (int64_t c = 0; c < p.size(2); ++c)
          for (int64_t d = 0; d < p.size(3); ++d, ++i) {
            const int64_t source = a * st[order[0]] + b * st[order[1]] + c * st[order[2]] + d * st[order[3]];
            ASSERT_EQ(got[i], static_cast<float>(source))
                << "order " << order[0] << order[1] << order[2] << order[3] << " at " << i;
            ASSERT_EQ(rounded[i], t_rounded[source]) << "bfloat16, at " << i;
          }
  }
}

TEST(Tensor, ReshapeCopiesOnlyWhenNeeded) {
  Tensor t = Tensor::arange(12, float32).view({3, 4});
  EXPECT_EQ(t.reshape({4, 3}).storage(), t.storage());
  Tensor tt = t.transpose(0, 1);  // [4, 3], not viewable as [12]
  EXPECT_THROW(tt.view({12}), Error);
  Tensor r = tt.reshape({12});
  EXPECT_NE(r.storage(), t.storage());
  EXPECT_EQ(r.to_vector<float>()[1], 4.0f);
  EXPECT_EQ(t.reshape({-1, 2}).shape(), (Shape{6, 2}));
  EXPECT_THROW(t.reshape({5, -1}), Error);
}

TEST(Tensor, ScalarsAndSingleElementsViewAsAnyShape) {
  Tensor s = Tensor::full({}, 3.0);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.view({1, 1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(s.reshape({1}).item(), 3.0);
  EXPECT_EQ(Tensor::full({1, 1}, 2.0).view({}).dim(), 0);
}

TEST(Tensor, CastRoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between two bfloat16 values (1 and 1 + 2^-7): ties go to the even mantissa, 1.
  // 1 + 3*2^-8 lies between 1 + 2^-7 and 1 + 2^-6: ties to even gives 1 + 2^-6.
  Tensor f = Tensor::from_vector<float>({1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.5f, 65504.0f}, {4});
  const auto b = f.to(bfloat16).to_vector<float>();
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], 1.0f + 1.0f / 64);
  EXPECT_EQ(b[2], -2.5f);
  const auto h = f.to(float16).to_vector<float>();
  EXPECT_EQ(h[3], 65504.0f);
  EXPECT_EQ(Tensor::from_vector<float>({65520.0f}, {1}).to(float16).item(), INFINITY);
  EXPECT_EQ(Tensor::from_vector<float>({2.5f, -1.7f}, {2}).to(int32).to_vector<int32_t>(),
            (std::vector<int32_t>{2, -1}));
}

TEST(Tensor, ErrorsNameTheOpAndShapes) {
  Tensor t = Tensor::zeros({2, 3});
  try {
    t.permute({0, 0});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("permute"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.narrow(1, 2, 2), Error);
  EXPECT_THROW(t.expand({4, 3}), Error);
  EXPECT_THROW(t.size(2), Error);
}

TEST(Device, ParsesAndRejects) {
  EXPECT_EQ(Device("cpu"), cpu);
  EXPECT_EQ(Device("cuda:1").index, 1);
  EXPECT_EQ(Device("tpu"), Device(DeviceType::TPU, 0));
  EXPECT_EQ(Device("xla-cpu:3"), Device(DeviceType::XlaCpu, 3));
  EXPECT_EQ(Device("xla-cpu:3").str(), "xla-cpu:3");
  EXPECT_EQ(Device("cuda").str(), "cuda:0");
  EXPECT_THROW(Device("gpu"), Error);
  EXPECT_THROW(Device("cpu:x"), Error);
  EXPECT_THROW(Device("xla-cpu:-1"), Error);
  EXPECT_THROW(Tensor::zeros({2}, float32, Device("cpu:1")), Error);
}

TEST(Device, CountsCurrentAndPeakBytes) {
  const auto before = memory_stats(cpu);
  reset_peak_memory(cpu);
  {
    Tensor a = Tensor::empty({1024, 1024}, float32);  // 4 MiB, taken from the allocator at first touch
    EXPECT_EQ(memory_stats(cpu).current_bytes, before.current_bytes);
    EXPECT_FALSE(a.storage()->is_allocated());
    a.raw_data();
    EXPECT_TRUE(a.storage()->is_allocated());
    EXPECT_EQ(memory_stats(cpu).current_bytes - before.current_bytes, 4 << 20);
  }
  const auto after = memory_stats(cpu);
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_GE(after.peak_bytes - before.current_bytes, 4 << 20);
}

TEST(DType, PromotionFollowsTorch) {
  EXPECT_EQ(promote_types(bfloat16, float16), float32);
  EXPECT_EQ(promote_types(bfloat16, float32), float32);
  EXPECT_EQ(promote_types(int64, bfloat16), bfloat16);
  EXPECT_EQ(promote_types(boolean, int32), int32);
  EXPECT_EQ(promote_types(uint8, int8), int16);
  EXPECT_THROW(parse_dtype("f8"), Error);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A storage keeps one derived form per type (a packed CPU copy beside a device copy): neither evicts the
// other, each is built once, and clear_derived() drops them all.
TEST(Storage, KeepsOneDerivedFormPerType) {
  struct PackedForm {
    int id;
  };
  struct DeviceForm {
    int id;
  };
  Tensor t = Tensor::zeros({4});
  int builds = 0;
  auto packed =
      t.storage()->derived<PackedForm>([&] { return std::make_shared<PackedForm>(PackedForm{++builds}); });
  auto device =
      t.storage()->derived<DeviceForm>([&] { return std::make_shared<DeviceForm>(DeviceForm{++builds}); });
  EXPECT_EQ(packed->id, 1);
  EXPECT_EQ(device->id, 2);
  EXPECT_EQ(
      t.storage()->derived<PackedForm>([&] { return std::make_shared<PackedForm>(PackedForm{++builds}); }),
      packed);
  EXPECT_EQ(builds, 2);
  t.storage()->clear_derived();
  EXPECT_EQ(t.storage()
                ->derived<DeviceForm>([&] { return std::make_shared<DeviceForm>(DeviceForm{++builds}); })
                ->id,
            3);
}

}  // namespace
}  // namespace kiln
