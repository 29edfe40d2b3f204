// The on-disk executable cache across processes: this test binary runs itself as a child (the
// PjrtDiskCacheChild test, which does nothing unless KILN_TEST_DISK_CACHE_CHILD is set) with one fresh
// KILN_CACHE_DIR. The first child compiles and saves; the second compiles nothing and loads everything from
// disk; after an entry is damaged, a third recompiles exactly that one with a warning.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "backends/pjrt/executable_cache.h"
#include "backends/pjrt/plugin_locator.h"
#include "kiln/core/tensor.h"
#include "kiln/ops.h"
#include "kiln/runtime/eager_mode.h"
#include "support/pjrt_devices.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

const Device xla0 = testing::test_device(0);

// In the child: a strict-eager op and a deferred-and-fused chain, then the cache's counts on stdout.
TEST(PjrtDiskCacheChild, RunsWhenAskedTo) {
  if (std::getenv("KILN_TEST_DISK_CACHE_CHILD") == nullptr) GTEST_SKIP() << "run by PjrtDiskCache only";
  const Tensor x = Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.75f}, {2, 3});
  const Tensor d = x.to(xla0);
  const double eager = sum(tanh(d)).item();
  Tensor fused;
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    fused = softmax(add(mul(d, 2.0), exp(d)), -1);
  }
  const std::vector<float> values = fused.to_vector<float>();
  const pjrt::ExecutableCacheStats s = pjrt::executable_cache_stats();
  std::printf("CHILD compiles=%lld disk_hits=%lld disk_rejected=%lld value=%.6f first=%.6f\n",
              static_cast<long long>(s.compiles), static_cast<long long>(s.disk_hits),
              static_cast<long long>(s.disk_rejected), eager, static_cast<double>(values[0]));
  std::fflush(stdout);
}

struct ChildRun {
  std::string output;  // stdout and stderr
  long long compiles = -1, disk_hits = -1, disk_rejected = -1;
  std::string values;
};

ChildRun run_child(const std::string& cache) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  // The plugin is found where this process found it (the locator looks in the cache folder too).
  const std::string command = "KILN_TEST_DISK_CACHE_CHILD=1 KILN_LOG=compile KILN_CACHE_DIR='" + cache +
                              "' KILN_PJRT_PLUGIN='" + pjrt::find_plugin(testing::test_device_kind()) +
                              "' '" + self + "' --gtest_filter=PjrtDiskCacheChild.RunsWhenAskedTo 2>&1";
  ChildRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) run.output += buffer;
  pclose(pipe);
  std::smatch m;
  const std::regex line(R"(CHILD compiles=(\d+) disk_hits=(\d+) disk_rejected=(\d+) (value=\S+ first=\S+))");
  if (std::regex_search(run.output, m, line)) {
    run.compiles = std::stoll(m[1]);
    run.disk_hits = std::stoll(m[2]);
    run.disk_rejected = std::stoll(m[3]);
    run.values = m[4];
  }
  return run;
}

TEST(PjrtDiskCache, ASecondProcessCompilesNothing) {
  KILN_SKIP_WITHOUT_PJRT();
  const fs::path cache = fs::temp_directory_path() / ("kiln-pjrt-disk-cache-" + std::to_string(getpid()));
  fs::remove_all(cache);

  const ChildRun cold = run_child(cache.string());
  ASSERT_GE(cold.compiles, 2) << "the child did not report (output:\n" << cold.output << ")";
  EXPECT_EQ(cold.disk_hits, 0);
  EXPECT_NE(cold.output.find("compiled a cpu executable for region["), std::string::npos) << cold.output;
  const fs::path folder = cache / "pjrt-executables";
  ASSERT_TRUE(fs::is_directory(folder)) << "nothing saved under " << folder;
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(folder)) entries.push_back(e.path());
  EXPECT_EQ(static_cast<long long>(entries.size()), cold.compiles) << "one entry per compiled executable";

  const ChildRun warm = run_child(cache.string());
  EXPECT_EQ(warm.compiles, 0) << warm.output;
  EXPECT_EQ(warm.disk_hits, cold.compiles);
  EXPECT_EQ(warm.values, cold.values) << "the loaded executables compute what the compiled ones did";
  EXPECT_NE(warm.output.find("disk cache hit for region["), std::string::npos) << warm.output;

  // A truncated entry is ignored with a warning and compiled (and saved) again; the others still load.
  ASSERT_FALSE(entries.empty());
  const auto size = fs::file_size(entries.front());
  fs::resize_file(entries.front(), size / 2);
  const ChildRun damaged = run_child(cache.string());
  EXPECT_EQ(damaged.compiles, 1) << damaged.output;
  EXPECT_EQ(damaged.disk_rejected, 1);
  EXPECT_EQ(damaged.disk_hits, cold.compiles - 1);
  EXPECT_NE(damaged.output.find("warning: PJRT executable cache: ignoring " + entries.front().string()),
            std::string::npos)
      << damaged.output;
  EXPECT_EQ(damaged.values, cold.values);
  EXPECT_EQ(fs::file_size(entries.front()), size) << "the damaged entry is rewritten";

  // Bytes changed in place (same length): the checksum catches them.
  {
    std::fstream f(entries.front(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size - 10));
    const int byte = f.get();
    f.seekp(static_cast<std::streamoff>(size - 10));
    f.put(static_cast<char>(byte ^ 0xff));
  }
  const ChildRun flipped = run_child(cache.string());
  EXPECT_EQ(flipped.compiles, 1) << flipped.output;
  EXPECT_EQ(flipped.disk_rejected, 1);
  fs::remove_all(cache);
}

}  // namespace
}  // namespace kiln
