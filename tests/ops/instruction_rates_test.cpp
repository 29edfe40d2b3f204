// The instruction-rate probe (src/backends/cpu/instruction_rates.h) and the automatic bf16 path it drives
// (matmul_path.h): what it measures follows the CPU's features, its cache file round-trips and belongs to
// one CPU model, an unwritable cache is tolerated, and cached rates decide the path. Nothing here depends on
// how fast this host is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/instruction_rates.h"
#include "backends/cpu/matmul_path.h"
#include "kiln/core/log.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using cpu_kernels::InstructionRates;

TEST(InstructionRates, MeasuresTheInstructionsThisCpuHas) {
  const auto& cpu = cpu_kernels::cpu_features();
  const InstructionRates r = cpu_kernels::measure_instruction_rates(0.01, false);
  EXPECT_EQ(r.fma32 > 0, cpu.avx512);
  EXPECT_EQ(r.dpbf16 > 0, cpu.avx512_bf16);
  if (!cpu.amx_bf16) {
    EXPECT_EQ(r.tdpbf16, 0);
  }
  EXPECT_EQ(r.best(), std::max({r.fma32, r.dpbf16, r.tdpbf16}));
  const std::string best = r.best_name();
  if (r.best() == 0) {
    EXPECT_EQ(best, "none");
  } else if (r.fma32 > r.dpbf16 && r.fma32 > r.tdpbf16) {
    EXPECT_EQ(best, "vfmadd231ps");
  } else if (r.dpbf16 > r.fma32 && r.dpbf16 > r.tdpbf16) {
    EXPECT_EQ(best, "vdpbf16ps");
  }
  EXPECT_NE(r.describe().find("vfmadd231ps"), std::string::npos);
}

TEST(InstructionRates, CacheTextRoundTripsAndBelongsToOneCpuModel) {
  const InstructionRates r{123.5, 234.25, 0};
  const std::string text = cpu_kernels::format_instruction_rates("cpu-a", r);
  InstructionRates back;
  ASSERT_TRUE(cpu_kernels::parse_instruction_rates(text, "cpu-a", back));
  EXPECT_DOUBLE_EQ(back.fma32, 123.5);
  EXPECT_DOUBLE_EQ(back.dpbf16, 234.25);
  EXPECT_DOUBLE_EQ(back.tdpbf16, 0);
  EXPECT_FALSE(cpu_kernels::parse_instruction_rates(text, "cpu-b", back));
  EXPECT_FALSE(cpu_kernels::parse_instruction_rates("", "cpu-a", back));
  EXPECT_FALSE(cpu_kernels::parse_instruction_rates(text.substr(0, text.size() / 2), "cpu-a", back));
  EXPECT_FALSE(cpu_kernels::parse_instruction_rates(
      cpu_kernels::format_instruction_rates("cpu-a", {-1.0, 2.0, 0.0}), "cpu-a", back));
}

TEST(InstructionRates, CachePathFollowsTheEnvironment) {
  const std::string key = cpu_kernels::cpu_model_key();
  EXPECT_FALSE(key.empty());
  EXPECT_EQ(key.find('/'), std::string::npos);
  const char* names[] = {"KILN_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
  std::string saved[3];
  bool had[3];
  for (int i = 0; i < 3; ++i) {
    const char* v = std::getenv(names[i]);
    had[i] = v != nullptr;
    if (v) saved[i] = v;
  }
  setenv("KILN_CACHE_DIR", "/tmp/kiln-a", 1);
  EXPECT_EQ(cpu_kernels::instruction_rates_cache_path(), "/tmp/kiln-a/cpu-rates-" + key + ".txt");
  unsetenv("KILN_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  EXPECT_EQ(cpu_kernels::instruction_rates_cache_path(), "/tmp/xdg/kiln/cpu-rates-" + key + ".txt");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/tmp/home", 1);
  EXPECT_EQ(cpu_kernels::instruction_rates_cache_path(), "/tmp/home/.cache/kiln/cpu-rates-" + key + ".txt");
  unsetenv("HOME");
  EXPECT_EQ(cpu_kernels::instruction_rates_cache_path(), "");
  for (int i = 0; i < 3; ++i) {
    if (had[i]) setenv(names[i], saved[i].c_str(), 1);
  }
}

// Run in a child process by the tests below (a process decides its path once): prints the decision.
TEST(InstructionRatesChild, PrintsTheBf16Path) {
  set_log_topics("matmul");
  std::printf("bf16 path: %s\n", cpu_kernels::bf16_path_name(cpu_kernels::bf16_path()));
  std::printf("amx usable: %d\nmodel key: %s\n", cpu_kernels::amx_usable() ? 1 : 0,
              cpu_kernels::cpu_model_key().c_str());
  set_log_topics("");
}

std::string run_child(const std::string& env) {
  const testing::ChildRun run =
      testing::run_this_binary("env -u KILN_CPU_MATMUL " + env, "InstructionRatesChild.PrintsTheBf16Path");
  EXPECT_EQ(run.status, 0) << run.output;
  return run.output;
}

TEST(InstructionRates, FirstProcessWritesTheCacheAndCachedRatesDecideThePath) {
  const std::string dir = testing::temp_dir("instruction_rates_cache");
  const std::string path = dir + "/cpu-rates-" + cpu_kernels::cpu_model_key() + ".txt";
  const std::string first = run_child("KILN_CACHE_DIR='" + dir + "'");
  std::ifstream in(path);
  const bool avx512 = cpu_kernels::use_avx512();
  if (avx512) {
    std::stringstream text;
    text << in.rdbuf();
    InstructionRates r;
    ASSERT_TRUE(cpu_kernels::parse_instruction_rates(text.str(), cpu_kernels::cpu_model_key(), r))
        << text.str();
    EXPECT_GT(r.fma32, 0);
  } else {
    // The portable kernels (no AVX-512, or KILN_CPU_ISA=generic) take oneDNN without measuring anything.
    EXPECT_FALSE(in.is_open()) << path;
    EXPECT_NE(first.find("bf16 path: onednn"), std::string::npos) << first;
  }

  // Planted rates: f32 FMA far ahead of every bf16 instruction, then the reverse. The AVX-512 kernels follow
  // the cache; the portable ones always keep oneDNN.
  for (const bool fma_wins : {true, false}) {
    std::ofstream(path) << cpu_kernels::format_instruction_rates(
        cpu_kernels::cpu_model_key(),
        fma_wins ? InstructionRates{1000, 10, 0} : InstructionRates{10, 1000, 0});
    const std::string out = run_child("KILN_CACHE_DIR='" + dir + "'");
    const std::string expected = fma_wins && avx512 ? "fma32" : "onednn";
    EXPECT_NE(out.find("bf16 path: " + expected), std::string::npos) << out;
    if (avx512) {
      EXPECT_NE(out.find("vfmadd231ps " + std::string(fma_wins ? "1000" : "10")), std::string::npos) << out;
    }
  }
}

// KILN_CPU_ISA=avx512: the process runs as on a CPU without AMX. Its probe measures no AMX rate, keeps what
// it measured under a model key of its own (not the one a process with AMX reads), and the path is chosen
// among the rest, whatever this host has.
TEST(InstructionRates, KilnCpuIsaAvx512RunsAsOnACpuWithoutAmx) {
  const std::string dir = testing::temp_dir("instruction_rates_avx512");
  const std::string out = run_child("KILN_CPU_ISA=avx512 KILN_CACHE_DIR='" + dir + "'");
  EXPECT_NE(out.find("amx usable: 0"), std::string::npos) << out;
  EXPECT_NE(out.find("bf16 path: "), std::string::npos) << out;
  EXPECT_EQ(out.find("bf16 path: amx"), std::string::npos) << out;
  const size_t at = out.find("model key: ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string key = out.substr(at + 11, out.find('\n', at) - at - 11);
  EXPECT_EQ(key.find("-amx"), std::string::npos) << key;
  if (cpu_kernels::amx_usable()) {
    EXPECT_NE(key, cpu_kernels::cpu_model_key());
  }
  if (cpu_kernels::cpu_features().avx512 && cpu_kernels::cpu_features().avx512_bf16) {
    EXPECT_NE(out.find("tdpbf16ps n/a"), std::string::npos) << out;
    std::ifstream in(dir + "/cpu-rates-" + key + ".txt");
    std::stringstream text;
    text << in.rdbuf();
    InstructionRates r;
    ASSERT_TRUE(cpu_kernels::parse_instruction_rates(text.str(), key, r)) << text.str();
    EXPECT_GT(r.fma32, 0);
    EXPECT_EQ(r.tdpbf16, 0);
  }
}

TEST(InstructionRates, UnwritableCacheOnlyMeansMeasuringAgain) {
  const std::string out = run_child("KILN_CACHE_DIR=/proc/kiln-no-such-dir");
  EXPECT_NE(out.find("bf16 path: "), std::string::npos) << out;
}

}  // namespace
}  // namespace kiln
