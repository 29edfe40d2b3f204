#include "backends/cpu/instruction_rates.h"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "backends/cpu/amx_tile_config.h"
#include "backends/cpu/cpu_features.h"
#include "core/cache_dir.h"

namespace kiln::cpu_kernels {

namespace {

// What a rate is measured against: wall time (what the cores deliver now, other tenants' load included: the
// benchmarks' ceilings, compared with work timed the same way) or this thread's CPU time (what a core does
// while it runs the loop: the cached per-core rates, which must not depend on what else the host ran while
// they were taken, since they decide the bf16 path of every later process).
enum class RateClock { Wall, ThreadCpu };

double now_seconds(RateClock clock) {
  if (clock == RateClock::ThreadCpu) {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// 24 independent chains: more than latency x throughput (4 x 2) on every core measured, so the loop runs at
// the issue rate. The asm barrier keeps the operands opaque so the compiler cannot fold the loop.
__attribute__((target("avx512f"))) double fma32_rate(double seconds, RateClock clock) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-30f);
  constexpr long kChunk = 100000;
  long iterations = 0;
  const double t0 = now_seconds(clock);
  double elapsed = 0;
  do {
    for (long i = 0; i < kChunk; ++i) {
      asm volatile("" : "+v"(a), "+v"(b));
#pragma GCC unroll 24
      for (int j = 0; j < 24; ++j) acc[j] = _mm512_fmadd_ps(a, b, acc[j]);
    }
    iterations += kChunk;
    elapsed = now_seconds(clock) - t0;
  } while (elapsed < seconds);
  float sink = 0;
  for (int i = 0; i < 24; ++i) sink += acc[i][0];
  asm volatile("" : : "x"(sink));
  return static_cast<double>(iterations) * 24 * 32.0 / elapsed;
}

__attribute__((target("avx512f,avx512bf16"))) double dpbf16_rate(double seconds, RateClock clock) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512i a = _mm512_set1_epi32(0x3f803f80), b = _mm512_set1_epi32(0x00010001);
  constexpr long kChunk = 100000;
  long iterations = 0;
  const double t0 = now_seconds(clock);
  double elapsed = 0;
  do {
    for (long i = 0; i < kChunk; ++i) {
      asm volatile("" : "+v"(a), "+v"(b));
#pragma GCC unroll 24
      for (int j = 0; j < 24; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)a, (__m512bh)b);
    }
    iterations += kChunk;
    elapsed = now_seconds(clock) - t0;
  } while (elapsed < seconds);
  float sink = 0;
  for (int i = 0; i < 24; ++i) sink += acc[i][0];
  asm volatile("" : : "x"(sink));
  return static_cast<double>(iterations) * 24 * 64.0 / elapsed;
}

// Four independent TDPBF16PS accumulators (tmm0-3) fed by two A tiles and two B tiles.
__attribute__((target("amx-tile,amx-bf16"))) double tdpbf16_rate(double seconds, RateClock clock) {
  load_amx_tile_config();
  alignas(64) static const uint16_t zeros[16 * 32] = {};
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, zeros, 64);
  _tile_loadd(5, zeros, 64);
  _tile_loadd(6, zeros, 64);
  _tile_loadd(7, zeros, 64);
  constexpr long kChunk = 50000;
  long iterations = 0;
  const double t0 = now_seconds(clock);
  double elapsed = 0;
  do {
    for (long i = 0; i < kChunk; ++i) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    iterations += kChunk;
    elapsed = now_seconds(clock) - t0;
  } while (elapsed < seconds);
  _tile_release();
  return static_cast<double>(iterations) * 4 * (2.0 * 16 * 16 * 32) / elapsed;
}

InstructionRates rates_on_this_thread(double seconds, RateClock clock) {
  const CpuFeatures& cpu = cpu_features();
  InstructionRates r;
  if (cpu.avx512) r.fma32 = fma32_rate(seconds, clock) * 1e-9;
  if (cpu.avx512_bf16) r.dpbf16 = dpbf16_rate(seconds, clock) * 1e-9;
  if (amx_usable()) r.tdpbf16 = tdpbf16_rate(seconds, clock) * 1e-9;
  return r;
}

// One core's rates for the cache: kRounds rounds of every instruction in turn, on this thread's CPU time,
// each instruction's best round kept. CPU time leaves out the time the thread waited for a core; the best
// round leaves out the ones another tenant's work slowed on the core itself (shared caches, the hypervisor).
// Timed on the wall clock in one go, as before 2026-12-05, a probe taken beside a parallel build measured
// 94-121 and 193-294 GFLOP/s on a Zen 5 core that gives 267 and 540: rates 2-2.8x low, and their ratio, which
// picks the path, off by up to 30%.
InstructionRates per_core_rates(double seconds) {
  constexpr int kRounds = 5;
  InstructionRates best;
  for (int i = 0; i < kRounds; ++i) {
    const InstructionRates r = rates_on_this_thread(seconds / kRounds, RateClock::ThreadCpu);
    best.fma32 = std::max(best.fma32, r.fma32);
    best.dpbf16 = std::max(best.dpbf16, r.dpbf16);
    best.tdpbf16 = std::max(best.tdpbf16, r.tdpbf16);
  }
  return best;
}

std::string sanitized(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
  return out;
}

}  // namespace

const char* InstructionRates::best_name() const {
  if (tdpbf16 > 0 && tdpbf16 >= dpbf16 && tdpbf16 >= fma32) return "tdpbf16ps";
  if (dpbf16 > 0 && dpbf16 >= fma32) return "vdpbf16ps";
  if (fma32 > 0) return "vfmadd231ps";
  return "none";
}

double InstructionRates::best() const {
  return std::max({fma32, dpbf16, tdpbf16});
}

std::string InstructionRates::describe(int cores) const {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed;
  auto one = [&](const char* name, double v) {
    s << name << ' ';
    if (v > 0)
      s << v * cores;
    else
      s << "n/a";
  };
  one("vfmadd231ps", fma32);
  s << ", ";
  one("vdpbf16ps", dpbf16);
  s << ", ";
  one("tdpbf16ps", tdpbf16);
  return s.str();
}

InstructionRates measure_instruction_rates(double seconds, bool all_threads) {
  if (!all_threads) return per_core_rates(seconds);
  InstructionRates total;
  std::mutex mutex;
#pragma omp parallel
  {
    const InstructionRates r = rates_on_this_thread(seconds, RateClock::Wall);
    std::lock_guard<std::mutex> lock(mutex);
    total.fma32 += r.fma32;
    total.dpbf16 += r.dpbf16;
    total.tdpbf16 += r.tdpbf16;
  }
  return total;
}

std::string cpu_model_key() {
  unsigned regs[12] = {};
  char vendor[13] = {};
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx)) {
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
  }
  char brand[49] = {};
  for (unsigned i = 0; i < 3; ++i)
    __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
  std::memcpy(brand, regs, 48);
  unsigned signature = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) signature = eax;
  // Family and model as Linux's /proc/cpuinfo reports them (base plus extended fields).
  unsigned family = (signature >> 8) & 0xf, model = (signature >> 4) & 0xf;
  if (family == 0xf) family += (signature >> 20) & 0xff;
  if (family >= 6) model += ((signature >> 16) & 0xf) << 4;
  const CpuFeatures& cpu = cpu_features();
  std::ostringstream key;
  std::string b(brand);
  while (!b.empty() && b.back() == ' ') b.pop_back();
  while (!b.empty() && b.front() == ' ') b.erase(b.begin());
  key << vendor << '-' << b << "-f" << family << "m" << model << "s" << (signature & 0xf)
      << (cpu.avx512 ? "-avx512" : "") << (cpu.avx512_bf16 ? "-bf16" : "") << (amx_usable() ? "-amx" : "");
  return sanitized(key.str());
}

std::string instruction_rates_cache_path() {
  const std::string dir = cache_dir();
  if (dir.empty()) return "";
  return (std::filesystem::path(dir) / ("cpu-rates-" + cpu_model_key() + ".txt")).string();
}

std::string format_instruction_rates(const std::string& key, const InstructionRates& r) {
  std::ostringstream s;
  s.precision(6);
  s << "kiln-instruction-rates 1\nkey " << key << "\nfma32 " << r.fma32 << "\ndpbf16 " << r.dpbf16
    << "\ntdpbf16 " << r.tdpbf16 << "\n";
  return s.str();
}

bool parse_instruction_rates(const std::string& text, const std::string& key, InstructionRates& out) {
  std::istringstream s(text);
  std::string word, version, file_key;
  InstructionRates r;
  if (!(s >> word >> version) || word != "kiln-instruction-rates" || version != "1") return false;
  if (!(s >> word >> file_key) || word != "key" || file_key != key) return false;
  for (double* field : {&r.fma32, &r.dpbf16, &r.tdpbf16}) {
    if (!(s >> word >> *field) || !(*field >= 0 && *field < 1e7)) return false;
  }
  out = r;
  return true;
}

const InstructionRates& host_instruction_rates() {
  static const InstructionRates rates = [] {
    const std::string key = cpu_model_key();
    const std::string path = instruction_rates_cache_path();
    InstructionRates r;
    if (!path.empty()) {
      std::ifstream in(path);
      std::stringstream text;
      text << in.rdbuf();
      if (in && parse_instruction_rates(text.str(), key, r)) return r;
    }
    r = measure_instruction_rates(0.05, false);
    if (!path.empty()) {
      // Written to a private name and renamed, so a concurrent reader never sees half a file.
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
      const std::string tmp = path + "." + std::to_string(getpid());
      {
        std::ofstream out(tmp);
        out << format_instruction_rates(key, r);
      }
      std::filesystem::rename(tmp, path, ec);
      if (ec) std::filesystem::remove(tmp, ec);
    }
    return r;
  }();
  return rates;
}

}  // namespace kiln::cpu_kernels
