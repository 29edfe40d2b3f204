#include <gtest/gtest.h>

#include <functional>

#include "kiln/core/device_runtime.h"
#include "kiln/ops/layout.h"
#include "kiln/runtime/execution_context.h"
#include "ops/reference_cases.h"

namespace kiln {
namespace {

using testing::load_reference_cases;
using testing::matches_reference;
using testing::operand;

TEST(Layout, MatchesTorchOnReferenceCases) {
  io::SafetensorsFile file(testing::data_path("kernels/layout.safetensors"));
  const auto cases = load_reference_cases(file);
  ASSERT_GT(cases.size(), 20u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string& op = c.arg("op");
    Tensor y;
    if (op == "concat" || op == "stack") {
      std::vector<Tensor> parts;
      for (int64_t i = 0; i < c.integer("count"); ++i)
        parts.push_back(file.tensor(c.name + ".input" + std::to_string(i)));
      y = op == "concat" ? concat(parts, c.integer("dim")) : stack(parts, c.integer("dim"));
    } else if (op == "embedding") {
      y = embedding(file.tensor(c.name + ".weight"), file.tensor(c.name + ".ids"));
    } else if (op == "upsample") {
      const Tensor x = operand(file, c, "input");
      if (c.has("scale")) {
        y = upsample_nearest2d(x, c.integer("scale"));
      } else {
        const auto size = c.ints("size");
        y = upsample_nearest2d(x, size[0], size[1]);
      }
    } else if (op == "rope") {
      const auto style = c.arg("style") == "interleaved" ? RopeStyle::Interleaved : RopeStyle::RotateHalf;
      y = apply_rope(operand(file, c, "input"), file.tensor(c.name + ".cos"), file.tensor(c.name + ".sin"),
                     style);
    } else {
      FAIL() << "unknown op " << op;
    }
    EXPECT_TRUE(matches_reference(y, file.tensor(c.name + ".expected"), c));
  }
}

Tensor iota(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return Tensor::from_vector(v, shape);
}

TEST(Layout, SplitAndChunkReturnViews) {
  const Tensor x = iota({4, 10});
  const auto parts = split(x, {3, 0, 7}, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].shape(), (Shape{4, 3}));
  EXPECT_EQ(parts[1].shape(), (Shape{4, 0}));
  EXPECT_EQ(parts[2].shape(), (Shape{4, 7}));
  EXPECT_EQ(parts[2].storage(), x.storage());
  EXPECT_EQ(parts[2].select(0, 1).to_vector<float>()[0], 13.0f);
  // torch.chunk: ceil(10 / 4) = 3 -> sizes 3, 3, 3, 1; ceil(10 / 6) = 2 -> only 5 chunks.
  auto sizes = [](const std::vector<Tensor>& ts) {
    std::vector<int64_t> s;
    for (const Tensor& t : ts) s.push_back(t.size(-1));
    return s;
  };
  EXPECT_EQ(sizes(chunk(x, 4, -1)), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(sizes(chunk(x, 6, 1)), (std::vector<int64_t>{2, 2, 2, 2, 2}));
  EXPECT_EQ(chunk(x, 2, 0)[1].to_vector<float>()[0], 20.0f);
  // concat of the chunks restores the input, including non-contiguous parts.
  EXPECT_TRUE(testing::all_close(concat(chunk(x, 3, 1), 1), x, 0, 0));
  EXPECT_TRUE(testing::all_close(concat(chunk(x.transpose(0, 1), 3, 1), 1), x.transpose(0, 1), 0, 0));
}

TEST(Layout, LargeConcatAndEmbeddingUseThreads) {
  // Above the parallel thresholds: results must match a plain copy.
  const Tensor a = iota({64, 300, 8}), b = iota({64, 100, 8});
  const Tensor c = concat({a, b}, 1);
  EXPECT_TRUE(testing::all_close(c.narrow(1, 0, 300), a, 0, 0));
  EXPECT_TRUE(testing::all_close(c.narrow(1, 300, 100), b, 0, 0));
  const Tensor w = iota({1000, 64});
  std::vector<int64_t> ids(5000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37) % 1000);
  const Tensor e = embedding(w, Tensor::from_vector(ids, {50, 100}));
  EXPECT_EQ(e.shape(), (Shape{50, 100, 64}));
  const auto v = e.to_vector<float>();
  for (size_t i = 0; i < ids.size(); i += 97) EXPECT_EQ(v[i * 64 + 5], static_cast<float>(ids[i] * 64 + 5));
}

void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    synchronize();  // errors found by a kernel (embedding's id range) surface at the next synchronisation
    ADD_FAILURE() << "expected kiln::Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Layout, BadArgumentsNameTheOp) {
  const Tensor x = iota({2, 3, 4});
  expect_error([&] { concat({x, iota({2, 3, 5})}, 1); }, "concat: tensor 1 has shape [2, 3, 5]");
  expect_error([&] { concat({}, 0); }, "concat: expected at least one tensor");
  expect_error([&] { stack({x, iota({2, 3})}, 0); }, "stack: tensor 1 has shape [2, 3]");
  expect_error([&] { split(x, {1, 1}, 1); }, "split: sizes [1, 1] add up to 2");
  expect_error([&] { chunk(x, 0, 0); }, "chunk: number of chunks must be positive");
  const Tensor w = iota({10, 4});
  expect_error(
      [&] {
        embedding(w, Tensor::from_vector<int64_t>({1, 10, 2}, {3}));
      },
      "embedding: id 10 at position 1");
  expect_error([&] { embedding(w, Tensor::from_vector<int32_t>({-1}, {1})); }, "embedding: id -1");
  expect_error([&] { embedding(w, iota({3})); }, "embedding: expected int32 or int64 ids");
  expect_error([&] { upsample_nearest2d(x, 2); }, "upsample_nearest2d: expected input [N, C, H, W]");
  expect_error([&] { upsample_nearest2d(iota({1, 1, 2, 2}), 0); }, "upsample_nearest2d: scale must be >= 1");
  const Tensor q = iota({1, 2, 5, 6});
  expect_error(
      [&] {
        apply_rope(iota({1, 2, 5, 7}), iota({5, 7}), iota({5, 7}), RopeStyle::Interleaved);
      },
      "apply_rope: the last dimension of x [1, 2, 5, 7] must be even");
  expect_error(
      [&] {
        apply_rope(q, iota({4, 6}), iota({5, 6}), RopeStyle::RotateHalf);
      },
      "apply_rope: cos must be [S, D] = [5, 6]");
}

}  // namespace
}  // namespace kiln
