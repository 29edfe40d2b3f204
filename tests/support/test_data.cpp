#include "support/test_data.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <system_error>
#include <vector>

namespace kiln::testing {

std::string data_path(const std::string& relative) {
  // $KILN_TEST_DATA_DIR moves the data: a test binary built on one machine and run on another (a GPU machine
  // given prebuilt binaries by scripts/device_bundle.sh) finds the checkout it runs beside.
  const char* moved = std::getenv("KILN_TEST_DATA_DIR");
  return std::string(moved != nullptr && *moved != '\0' ? moved : KILN_TEST_DATA_DIR) + "/" + relative;
}

namespace {
// The directories temp_dir made, removed when the test process exits (ctest runs each test in a process of
// its own, so without this every run would leave its files in /tmp). Unlinking a file that is still mapped is
// fine on Linux: the mapping keeps the pages until it goes.
class TempDirs {
 public:
  ~TempDirs() {
    for (const auto& dir : dirs_) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }
  void add(const std::filesystem::path& dir) {
    std::lock_guard<std::mutex> lock(mutex_);
    dirs_.push_back(dir);
  }

 private:
  std::mutex mutex_;
  std::vector<std::filesystem::path> dirs_;
};
}  // namespace

std::string temp_dir(const std::string& name) {
  static TempDirs made;
  // A death test's child (the "threadsafe" style runs the test again in a new process, which ends without
  // running destructors) takes its parent's directory: the parent's assertions then see what the child left,
  // and the parent removes it.
  const bool death_test_child = !GTEST_FLAG_GET(internal_run_death_test).empty();
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kiln_test_" + std::to_string(death_test_child ? ::getppid() : ::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  if (!death_test_child) made.add(dir);
  return dir.string();
}

ChildRun run_this_binary(const std::string& env, const std::string& filter) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string log = temp_dir("child_run") + "/log.txt";
  const std::string cmd = env + " '" + self + "' --gtest_filter='" + filter + "' > '" + log + "' 2>&1";
  ChildRun run;
  run.status = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream out;
  out << in.rdbuf();
  run.output = out.str();
  return run;
}

Tensor values(const Shape& shape, uint32_t seed, double lo, double hi, DType dtype) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  uint32_t s = seed * 2654435761u + 12345u;
  for (float& e : v) {
    s = s * 1664525u + 1013904223u;
    e = static_cast<float>(lo + (hi - lo) * (s >> 8) / 16777216.0);
  }
  return Tensor::from_vector(v, shape).to(dtype);
}

double process_status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field + ":", 0) == 0) return 1024.0 * std::atof(line.c_str() + field.size() + 1);
  return 0;
}

namespace {
::testing::AssertionResult same_shape(const Tensor& a, const Tensor& e) {
  if (a.shape() != e.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(a.shape()) << " != expected " << shape_str(e.shape());
  return ::testing::AssertionSuccess();
}
std::string index_str(int64_t flat, const Shape& shape) {
  Shape idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % std::max<int64_t>(shape[d], 1);
    flat /= std::max<int64_t>(shape[d], 1);
  }
  return shape_str(idx);
}
}  // namespace

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (auto r = same_shape(actual, expected); !r) return r;
  const auto a = actual.to_vector<double>();
  const auto e = expected.to_vector<double>();
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(e[i]);
    const bool same_inf = std::isinf(a[i]) && a[i] == e[i];
    if (both_nan || same_inf) continue;
    const double diff = std::abs(a[i] - e[i]);
    if (!(diff <= atol + rtol * std::abs(e[i]))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
      if (!(diff <= worst)) worst = diff;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << a.size() << " elements differ (rtol " << rtol << ", atol " << atol
         << "); first at " << index_str(first, actual.shape()) << ": " << a[first] << " vs expected "
         << e[first] << "; worst |diff| " << worst;
}

::testing::AssertionResult rel_max_error_within(const Tensor& actual, const Tensor& expected,
                                                double tolerance) {
  if (auto r = same_shape(actual, expected); !r) return r;
  const auto a = actual.to_vector<double>();
  const auto e = expected.to_vector<double>();
  double max_diff = 0, max_ref = 0;
  int64_t where = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(a[i] - e[i]);
    if (!(d <= max_diff)) {
      max_diff = d;
      where = static_cast<int64_t>(i);
    }
    max_ref = std::max(max_ref, std::abs(e[i]));
  }
  const double rel = max_diff / std::max(max_ref, 1e-30);
  if (rel <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "relative max error " << rel << " > " << tolerance << " (max |diff| " << max_diff << " at "
         << index_str(where, actual.shape()) << ": " << a[where] << " vs " << e[where] << "; max |expected| "
         << max_ref << ")";
}

double share_within_one_level(const std::vector<uint8_t>& pixels, const Tensor& reference_u8) {
  const auto ref = reference_u8.to_vector<uint8_t>();
  EXPECT_EQ(ref.size(), pixels.size());
  size_t ok = 0;
  for (size_t i = 0; i < ref.size() && i < pixels.size(); ++i)
    ok += std::abs(int(ref[i]) - int(pixels[i])) <= 1;
  return static_cast<double>(ok) / static_cast<double>(ref.size());
}

double mean_level_difference(const std::vector<uint8_t>& pixels, const Tensor& reference_u8) {
  const auto ref = reference_u8.to_vector<uint8_t>();
  EXPECT_EQ(ref.size(), pixels.size());
  double total = 0;
  for (size_t i = 0; i < ref.size() && i < pixels.size(); ++i)
    total += std::abs(int(ref[i]) - int(pixels[i]));
  return total / static_cast<double>(ref.size());
}

}  // namespace kiln::testing
