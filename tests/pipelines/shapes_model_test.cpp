// models/kiln-shapes-64, the small trained FLUX pipeline shipped with Kiln (tools/train_tiny_flux):
// Kiln's images equal diffusers' FluxPipeline images, and prompts whose (shape, colour, background)
// combination was held out of training still produce what they ask for, checked by a simple pixel analysis.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/io/safetensors.h"
#include "support/test_data.h"

namespace kiln {
namespace {

std::string model_dir() {
  return testing::data_path("../../models/kiln-shapes-64");
}

constexpr int64_t kMaxSequenceLength = 40;  // what the model was trained with

PipelineRequest shapes_call(const std::string& prompt, uint64_t seed, int steps) {
  PipelineRequest c;
  c.prompt = prompt;
  c.height = 64;
  c.width = 64;
  c.num_inference_steps = steps;
  c.guidance_scale = 0.0f;
  c.generator = Generator(seed);
  c.max_sequence_length = kMaxSequenceLength;
  return c;
}

class ShapesModelParity : public ::testing::TestWithParam<const char*> {};

TEST_P(ShapesModelParity, ImageEqualsDiffusersWithinOneLevel) {
  io::SafetensorsFile golden(
      testing::data_path(std::string("goldens/shapes/") + GetParam() + ".safetensors"));
  const auto& m = golden.metadata();
  ASSERT_EQ(std::stoll(m.at("max_sequence_length")), kMaxSequenceLength);
  auto pipe = FluxPipeline::from_pretrained(model_dir());
  const auto out = pipe(shapes_call(m.at("prompt"), std::stoull(m.at("seed")), std::stoi(m.at("steps"))));
  ASSERT_EQ(out.images.size(), 1u);
  EXPECT_GE(testing::share_within_one_level(out.images[0].pixels, golden.tensor("image_u8")), 0.99)
      << m.at("prompt");
}

INSTANTIATE_TEST_SUITE_P(Goldens, ShapesModelParity,
                         ::testing::Values("default_s0", "seen_s42", "square_s7_8steps"));

// ---- pixel analysis of generated pictures

struct NamedColor {
  const char* name;
  std::array<double, 3> rgb;
};
// The palette of tools/train_tiny_flux/dataset.py.
constexpr std::array<NamedColor, 8> kPalette{{{"red", {220, 30, 30}},
                                              {"orange", {245, 140, 20}},
                                              {"yellow", {240, 220, 30}},
                                              {"green", {40, 170, 60}},
                                              {"blue", {30, 70, 220}},
                                              {"purple", {140, 50, 180}},
                                              {"white", {245, 245, 245}},
                                              {"black", {20, 20, 20}}}};

double distance(const std::array<double, 3>& a, const std::array<double, 3>& b) {
  return std::sqrt((a[0] - b[0]) * (a[0] - b[0]) + (a[1] - b[1]) * (a[1] - b[1]) +
                   (a[2] - b[2]) * (a[2] - b[2]));
}

std::string nearest_color(const std::array<double, 3>& rgb) {
  const char* best = "";
  double best_d = std::numeric_limits<double>::max();
  for (const auto& c : kPalette) {
    if (const double d = distance(rgb, c.rgb); d < best_d) best_d = d, best = c.name;
  }
  return best;
}

struct Analysis {
  std::string background, shape_color;
  double cx = 0, cy = 0;  // centroid of the shape's pixels
  int64_t area = 0;       // pixels not of the background colour
  // The shape's area over its bounding box's area: pi/4 = 0.785 for a circle, 1 for a square, 0.5 for the
  // dataset's triangle. Soft: a pixel counts by how far it lies from the background colour towards the shape
  // colour, and the box's width (height) is the sum over columns (rows) of the largest such fraction, so
  // blurred or anti-aliased edges count by how much of the shape they hold.
  double fill = 0;
  std::string shape;  // the class the fill ratio says
};

// Fill-ratio boundaries between triangle (0.5), circle (0.785) and square (1.0); the same in
// tools/train_tiny_flux/shape_metrics.py, which measures the model on many more prompts.
constexpr double kTriangleBelow = 0.65;
constexpr double kSquareAbove = 0.90;

// The background is the mean colour of the 2-pixel border; the shape is every pixel far from it.
Analysis analyse(const Image& im) {
  auto at = [&](int x, int y) {
    const size_t i = (static_cast<size_t>(y) * im.width + x) * 3;
    return std::array<double, 3>{double(im.pixels[i]), double(im.pixels[i + 1]), double(im.pixels[i + 2])};
  };
  std::array<double, 3> border{0, 0, 0};
  int n = 0;
  for (int y = 0; y < im.height; ++y)
    for (int x = 0; x < im.width; ++x)
      if (x < 2 || y < 2 || x >= im.width - 2 || y >= im.height - 2) {
        const auto p = at(x, y);
        for (int c = 0; c < 3; ++c) border[c] += p[c];
        ++n;
      }
  for (auto& v : border) v /= n;
  Analysis a;
  a.background = nearest_color(border);
  // Shape pixels: far from the background. Its colour: the mean of the quarter of them farthest from the
  // background (the interior; anti-aliased and blurred edges are a mix of both colours).
  std::vector<std::pair<double, std::array<double, 3>>> shape;
  for (int y = 0; y < im.height; ++y)
    for (int x = 0; x < im.width; ++x) {
      const auto p = at(x, y);
      if (const double d = distance(p, border); d > 90) {
        shape.emplace_back(d, p);
        a.cx += x + 0.5;
        a.cy += y + 0.5;
        ++a.area;
      }
    }
  if (a.area > 0) {
    a.cx /= static_cast<double>(a.area);
    a.cy /= static_cast<double>(a.area);
    std::sort(shape.begin(), shape.end(), [](const auto& l, const auto& r) { return l.first > r.first; });
    std::array<double, 3> fg{0, 0, 0};
    const size_t core = (shape.size() + 3) / 4;
    for (size_t i = 0; i < core; ++i)
      for (int c = 0; c < 3; ++c) fg[c] += shape[i].second[c] / static_cast<double>(core);
    a.shape_color = nearest_color(fg);

    const double full = std::max(distance(fg, border), 1.0);
    std::vector<double> col_max(im.width, 0.0), row_max(im.height, 0.0);
    double soft_area = 0;
    for (int y = 0; y < im.height; ++y)
      for (int x = 0; x < im.width; ++x) {
        double m = std::min(distance(at(x, y), border) / full, 1.0);
        if (m < 0.1) m = 0;  // background noise does not widen the box
        soft_area += m;
        col_max[x] = std::max(col_max[x], m);
        row_max[y] = std::max(row_max[y], m);
      }
    double w = 0, h = 0;
    for (const double v : col_max) w += v;
    for (const double v : row_max) h += v;
    a.fill = soft_area / (w * h);
    a.shape = a.fill < kTriangleBelow ? "triangle" : a.fill > kSquareAbove ? "square" : "circle";
  }
  return a;
}

// A picture drawn like tools/train_tiny_flux/dataset.py draws its training pictures (4x4 supersampled):
// `shape` of half extent r centred at (cx, cy), colour fg on bg.
Image render_shape(const std::string& shape, double cx, double cy, double r, const std::array<double, 3>& fg,
                   const std::array<double, 3>& bg) {
  Image im;
  im.width = im.height = 64;
  im.pixels.resize(64 * 64 * 3);
  constexpr int kSuper = 4;
  for (int y = 0; y < 64; ++y)
    for (int x = 0; x < 64; ++x) {
      int inside = 0;
      for (int sy = 0; sy < kSuper; ++sy)
        for (int sx = 0; sx < kSuper; ++sx) {
          const double px = x + (sx + 0.5) / kSuper, py = y + (sy + 0.5) / kSuper;
          bool in = false;
          if (shape == "circle") {
            in = (px - cx) * (px - cx) + (py - cy) * (py - cy) <= r * r;
          } else if (shape == "square") {
            in = std::abs(px - cx) <= r && std::abs(py - cy) <= r;
          } else {  // apex at the top, base 2.2 r wide at the bottom
            const double frac = (py - (cy - r)) / (2 * r);
            in = frac >= 0 && frac <= 1 && std::abs(px - cx) <= frac * r * 1.1;
          }
          inside += in;
        }
      const double t = inside / double(kSuper * kSuper);
      for (int c = 0; c < 3; ++c)
        im.pixels[(static_cast<size_t>(y) * 64 + x) * 3 + c] =
            static_cast<uint8_t>(std::lround(t * fg[c] + (1 - t) * bg[c]));
    }
  return im;
}

TEST(ShapesModel, AnalysisTellsTheTrainingShapesApart) {
  // The classifier the model is judged by, on exact pictures of both sizes, off-grid positions and several
  // colour pairs: every shape gets its own class (so a blob that is neither fails the model tests).
  const std::array<double, 3> red{220, 30, 30}, white{245, 245, 245}, blue{30, 70, 220}, yellow{240, 220, 30};
  for (const char* shape : {"circle", "square", "triangle"})
    for (const double r : {6.3, 7.0, 12.0, 13.2})
      for (const auto& [fg, bg] : {std::pair{red, white}, std::pair{blue, yellow}, std::pair{white, blue}}) {
        const auto a = analyse(render_shape(shape, 30.4, 33.7, r, fg, bg));
        EXPECT_EQ(a.shape, shape) << "r " << r << ", fill " << a.fill;
      }
}

struct HeldOutCase {
  const char* size;
  const char* color;
  const char* shape;
  const char* position;
  const char* background;
  double x, y;  // where the shape's centre is drawn in the training pictures
};

// Every (shape, colour, background) below is in dataset.HELD_OUT: never seen in training in any position or
// size.
constexpr std::array<HeldOutCase, 6> kHeldOut{{
    {"big", "red", "circle", "on the left", "yellow", 16, 32},
    {"small", "blue", "square", "at the top", "white", 32, 16},
    {"big", "green", "triangle", "in the center", "purple", 32, 32},
    {"big", "white", "circle", "on the right", "black", 48, 32},
    {"big", "orange", "square", "at the bottom", "green", 32, 48},
    {"small", "yellow", "triangle", "on the right", "blue", 48, 32},
}};

// How many of the 12 held-out pictures (6 prompts x seeds 0 and 1) must get the asked shape's class. The
// shipped model gets 9 (its model card lists them: all circles, big squares and big triangles; the small
// square comes out with rounded corners, fill 0.83-0.85, and one of the two small triangles sits at 0.654,
// just above the 0.65 boundary); the floor leaves room for that borderline picture only, so a model that
// draws worse fails. Raise it when a retrained model draws better.
constexpr int kHeldOutShapesRight = 8;

TEST(ShapesModel, HeldOutCombinationsFollowThePrompt) {
  auto pipe = FluxPipeline::from_pretrained(model_dir());
  int right_shapes = 0;
  for (const auto& c : kHeldOut) {
    const std::string prompt = std::string("a ") + c.size + " " + c.color + " " + c.shape + " " + c.position +
                               ", on a " + c.background + " background";
    for (uint64_t seed : {0u, 1u}) {
      SCOPED_TRACE(prompt + ", seed " + std::to_string(seed));
      const auto a = analyse(pipe(shapes_call(prompt, seed, 4)).images[0]);
      // The background (dominant) colour, the shape's colour, a shape of about the asked size, its position.
      EXPECT_EQ(a.background, c.background);
      EXPECT_EQ(a.shape_color, c.color);
      // A small shape covers about 100-200 pixels, a big one 300-600 (of 4096); the model draws them smaller.
      const bool big = std::string(c.size) == "big";
      EXPECT_GE(a.area, big ? 120 : 40);
      EXPECT_LE(a.area, big ? 800 : 300);
      EXPECT_NEAR(a.cx, c.x, 6.0);
      EXPECT_NEAR(a.cy, c.y, 6.0);
      right_shapes += a.shape == c.shape;
    }
  }
  // The shape itself, told by the fill ratio of its box (circle 0.785, square 1, triangle 0.5).
  EXPECT_GE(right_shapes, kHeldOutShapesRight) << "of " << 2 * kHeldOut.size();
}

TEST(ShapesModel, ShapeWordChangesTheShape) {
  // The same held-out prompts with each shape word, same seed: the triangle must fill less of its box than
  // the circle and the square more than the circle, on all 6 (the shipped model's squares fill 0.84-0.93 of
  // their box, its circles 0.72-0.81).
  auto pipe = FluxPipeline::from_pretrained(model_dir());
  int squares_fuller = 0;
  for (const auto& c : kHeldOut) {
    std::map<std::string, double> fill;
    for (const char* shape : {"circle", "square", "triangle"}) {
      const std::string prompt = std::string("a ") + c.size + " " + c.color + " " + shape + " " + c.position +
                                 ", on a " + c.background + " background";
      fill[shape] = analyse(pipe(shapes_call(prompt, 0, 4)).images[0]).fill;
    }
    SCOPED_TRACE(std::string(c.size) + " " + c.color + " on " + c.background + " " + c.position);
    EXPECT_LT(fill["triangle"], fill["circle"]);
    squares_fuller += fill["square"] > fill["circle"];
  }
  EXPECT_EQ(squares_fuller, 6);
}

TEST(ShapesModel, TrainedCombinationsGetTheirColoursAndPositions) {
  // Same seed, other colours and position: the analysis tells them apart (so it can fail), shape colour
  // included.
  auto pipe = FluxPipeline::from_pretrained(model_dir());
  const auto a =
      analyse(pipe(shapes_call("a big blue square on the left, on a white background", 0, 4)).images[0]);
  const auto b =
      analyse(pipe(shapes_call("a big red square on the right, on a black background", 0, 4)).images[0]);
  EXPECT_EQ(a.shape_color, "blue");
  EXPECT_EQ(b.shape_color, "red");
  EXPECT_EQ(a.background, "white");
  EXPECT_EQ(b.background, "black");
  EXPECT_LT(a.cx, 32);
  EXPECT_GT(b.cx, 32);
}

}  // namespace
}  // namespace kiln
