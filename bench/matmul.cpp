// kiln::linear against a raw oneDNN matmul in its best configuration (cpu-limits.md section 2: weights
// reordered once into the layout oneDNN picks for format `any`, output in the input dtype), on the DiT
// shapes M x K x N = 4096 x 3072 x {3072, 12288} and 4096 x 12288 x 3072, bf16 and f32. Also times
// kiln::linear with prepacking off (the [N, K] weight used in place), the evidence behind the default.
//
// The three variants run interleaved, repetition by repetition, so that load from other tenants of the
// host hits them alike. Prints GFLOP/s (best and median), % of the ceiling measured in the same run
// (bf16_ceiling.h: the fastest instruction a bf16 product can use for bf16, f32 FMA for float32) and
// kiln / oneDNN. Also prints every instruction's ceiling and the bf16 path in use.
// `paths` compares the bf16 paths side by side instead (bench_paths, issue #30); `offset` times bf16 products
// whose x starts 424 bytes past a cache line (as an input mapped from a safetensors file can) against the
// same product on an aligned x (bench_offset); `quantized` times bf16 products with a GGUF-quantized or fp8
// weight on each bf16 path (bench_quantized).
// Usage: bench_matmul [repetitions=5] [bf16|f32|all|paths|offset|quantized]
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <ctime>
#include <fstream>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/matmul_path.h"
#include "bench_util.h"
#include "bf16_ceiling.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/quantized_linear.h"
#include "kiln/runtime/execution_context.h"
#include "quantize_blocks.h"

namespace {

using kiln::bench::time_of;
using kiln::bench::Timing;

// The best raw oneDNN configuration: src [M, K] row-major, weights prepacked once (outside the timing),
// dst [M, N] row-major in the compute dtype, library-managed scratchpad.
class RawOnednn {
 public:
  RawOnednn(const kiln::Tensor& x, const kiln::Tensor& w, const kiln::Tensor& y)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    using dnnl::memory;
    const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
    const auto dt = x.dtype() == kiln::bfloat16 ? memory::data_type::bf16 : memory::data_type::f32;
    const memory::desc src_md({m, k}, dt, memory::format_tag::ab);
    const memory::desc w_plain({k, n}, dt, memory::format_tag::ba);  // torch's [N, K] weight
    const memory::desc w_any({k, n}, dt, memory::format_tag::any);
    const memory::desc dst_md({m, n}, dt, memory::format_tag::ab);
    pd_ = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, w_any, dst_md), engine_);
    prim_ = dnnl::matmul(pd_);
    packed_ = memory(pd_.weights_desc(), engine_);
    memory w_mem(w_plain, engine_, w.raw_data());
    dnnl::reorder(w_mem, packed_).execute(stream_, w_mem, packed_);
    src_ = memory(src_md, engine_, x.raw_data());
    dst_ = memory(dst_md, engine_, y.raw_data());
    stream_.wait();
  }
  void run() {
    prim_.execute(stream_, {{DNNL_ARG_SRC, src_}, {DNNL_ARG_WEIGHTS, packed_}, {DNNL_ARG_DST, dst_}});
    stream_.wait();
  }
  const char* impl() const { return pd_.impl_info_str(); }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul prim_;
  dnnl::memory packed_, src_, dst_;
};

// GFLOP/s from wall time, and from CPU time scaled to the thread count ("if the cores were ours"): on a
// host shared with other work, wall time mostly measures the neighbours; CPU time does not count the time
// our threads spent descheduled (run with OMP_WAIT_POLICY=passive so that waiting threads do not spin).
struct Stats {
  std::vector<double> gflops, cpu_gflops;
  void add(double flop, Timing t, int threads) {
    gflops.push_back(flop / t.wall * 1e-9);
    cpu_gflops.push_back(flop / (t.cpu / threads) * 1e-9);
  }
  double cpu_best() const { return *std::max_element(cpu_gflops.begin(), cpu_gflops.end()); }
  double best() const { return *std::max_element(gflops.begin(), gflops.end()); }
  double median() const {
    std::vector<double> s = gflops;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
};

double max_rel_diff(const kiln::Tensor& a, const kiln::Tensor& b) {
  const auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  double diff = 0, ref = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(va[i] - vb[i])));
    ref = std::max(ref, static_cast<double>(std::abs(vb[i])));
  }
  return diff / std::max(ref, 1e-30);
}

void bench(int64_t m, int64_t k, int64_t n, kiln::DType dtype, int reps, int threads,
           const kiln::bench::Bf16Ceiling& c) {
  const double peak = dtype == kiln::bfloat16 ? c.gflops : c.rates.fma32;
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
  const kiln::Tensor x = kiln::bench::uniform_tensor({m, k}, dtype, 1.0f, 1);
  const kiln::Tensor w =
      kiln::bench::uniform_tensor({n, k}, dtype, 1.0f / std::sqrt(static_cast<float>(k)), 2);
  // Same bytes, separate Storage: prepacking off must not find the packed copy cached on `w`.
  const kiln::Tensor w_inplace = w.clone();
  const kiln::Tensor y_raw = kiln::Tensor::empty({m, n}, dtype);

  kiln::synchronize();  // the raw path reads x and w through raw_data(), which does not wait for their casts
  RawOnednn raw(x, w, y_raw);
  Stats s_raw, s_kiln, s_inplace;
  kiln::Tensor y_kiln, y_inplace;
  // Warm-up: primitive creation, packing, JIT, page faults on the outputs.
  raw.run();
  kiln::set_weight_prepacking(kiln::WeightPrepacking::Always);
  y_kiln = kiln::linear(x, w);
  kiln::set_weight_prepacking(kiln::WeightPrepacking::Never);
  y_inplace = kiln::linear(x, w_inplace);
  for (int r = 0; r < reps; ++r) {
    s_raw.add(flop, time_of([&] { raw.run(); }), threads);
    kiln::set_weight_prepacking(kiln::WeightPrepacking::Always);
    s_kiln.add(flop, time_of([&] { y_kiln = kiln::linear(x, w); }), threads);
    kiln::set_weight_prepacking(kiln::WeightPrepacking::Never);
    s_inplace.add(flop, time_of([&] { y_inplace = kiln::linear(x, w_inplace); }), threads);
  }
  std::printf(
      "%5lld x %5lld x %5lld %-8s | oneDNN %6.0f (%3.0f%%) med %6.0f | kiln %6.0f (%3.0f%%) med %6.0f"
      " | kiln/oneDNN %.3f (med %.3f) | kiln in-place %6.0f (%3.0f%%) med %6.0f, %.3f of packed"
      " | max rel diff %.1e\n",
      static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
      std::string(kiln::dtype_name(dtype)).c_str(), s_raw.best(), 100 * s_raw.best() / peak, s_raw.median(),
      s_kiln.best(), 100 * s_kiln.best() / peak, s_kiln.median(), s_kiln.best() / s_raw.best(),
      s_kiln.median() / s_raw.median(), s_inplace.best(), 100 * s_inplace.best() / peak, s_inplace.median(),
      s_inplace.best() / s_kiln.best(), max_rel_diff(y_kiln, y_raw));
  std::printf(
      "%32s cpu-time GFLOP/s: oneDNN %6.0f | kiln %6.0f | kiln/oneDNN %.3f | in-place %6.0f, %.3f of "
      "packed\n",
      "", s_raw.cpu_best(), s_kiln.cpu_best(), s_kiln.cpu_best() / s_raw.cpu_best(), s_inplace.cpu_best(),
      s_inplace.cpu_best() / s_kiln.cpu_best());
  std::fflush(stdout);
}

// Runs `f` with bf16 products forced onto `path`, its queued kernels finished before the path is restored.
template <class F>
void on_path(kiln::cpu_kernels::Bf16Path path, F&& f) {
  const kiln::cpu_kernels::ScopedBf16Path forced(path);
  f();
  kiln::synchronize();
}

// bf16 on each path side by side (issue #30): kiln::linear on the path this host picks, forced onto fma32
// (f32 FMA on widened bf16, the weight read in place) and forced onto oneDNN's bf16 kernels (weights
// prepacked), against raw oneDNN f32 (prepacked) on the same values; % of the f32 FMA ceiling and of the
// fastest instruction's, both measured at the start of the run.
void bench_paths(int64_t m, int64_t k, int64_t n, int reps, int threads, const kiln::bench::Bf16Ceiling& c) {
  using kiln::cpu_kernels::Bf16Path;
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
  const kiln::Tensor x = kiln::bench::uniform_tensor({m, k}, kiln::bfloat16, 1.0f, 1);
  const kiln::Tensor w =
      kiln::bench::uniform_tensor({n, k}, kiln::bfloat16, 1.0f / std::sqrt(static_cast<float>(k)), 2);
  const kiln::Tensor w_fma = w.clone();  // never packed: the fma32 path reads it in place
  const kiln::Tensor x32 = x.to(kiln::float32), w32 = w.to(kiln::float32);
  const kiln::Tensor y32 = kiln::Tensor::empty({m, n}, kiln::float32);
  kiln::synchronize();
  RawOnednn raw32(x32, w32, y32);
  kiln::set_weight_prepacking(kiln::WeightPrepacking::Always);
  Stats s_default, s_fma, s_onednn, s_raw32;
  kiln::Tensor y_default, y_fma, y_onednn;
  const auto run_default = [&] {
    y_default = kiln::linear(x, w);
    kiln::synchronize();
  };
  const auto run_fma = [&] { on_path(Bf16Path::Fma32, [&] { y_fma = kiln::linear(x, w_fma); }); };
  const auto run_onednn = [&] { on_path(Bf16Path::Onednn, [&] { y_onednn = kiln::linear(x, w); }); };
  raw32.run();
  run_default();
  run_fma();
  run_onednn();
  for (int r = 0; r < reps; ++r) {
    s_default.add(flop, time_of(run_default), threads);
    s_fma.add(flop, time_of(run_fma), threads);
    s_onednn.add(flop, time_of(run_onednn), threads);
    s_raw32.add(flop, time_of([&] { raw32.run(); }), threads);
  }
  const double fma_ceiling = c.rates.fma32, best = c.gflops;
  std::printf(
      "%5lld x %5lld x %5lld bf16 | default (%s) %4.0f med %4.0f | fma32 %4.0f med %4.0f = %3.0f%% of f32 "
      "FMA "
      "%.0f, %3.0f%% of best %.0f | onednn-bf16 %4.0f med %4.0f | onednn-f32 %4.0f med %4.0f = %3.0f%% of "
      "f32 "
      "FMA | fma32 vs onednn-bf16 max rel diff %.1e\n",
      static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
      kiln::cpu_kernels::bf16_path_name(kiln::cpu_kernels::bf16_path()), s_default.best(), s_default.median(),
      s_fma.best(), s_fma.median(), 100 * s_fma.best() / fma_ceiling, fma_ceiling, 100 * s_fma.best() / best,
      best, s_onednn.best(), s_onednn.median(), s_raw32.best(), s_raw32.median(),
      100 * s_raw32.best() / fma_ceiling, max_rel_diff(y_fma, y_onednn));
  std::printf(
      "%29s cpu-time GFLOP/s: default %4.0f | fma32 %4.0f (%3.0f%% of f32 FMA) | onednn-bf16 %4.0f | "
      "onednn-f32 %4.0f\n",
      "", s_default.cpu_best(), s_fma.cpu_best(), 100 * s_fma.cpu_best() / fma_ceiling, s_onednn.cpu_best(),
      s_raw32.cpu_best());
  std::fflush(stdout);
}

// bf16 x times a Q8_0 weight (GGUF's common type; every block type expands its panels the same way) or an
// F8_E4M3 one (an fp8 checkpoint's), side by side:
// kiln::linear on the path this host picks, forced onto fma32 and forced onto oneDNN, and the same product
// with the dense bf16 weight (the dequantized values) on the path this host picks (prepacked) and on fma32;
// % of the f32 FMA ceiling and of the fastest instruction's. The quantized products expand the weight into
// bf16 panels on every call, which the dense ones do not.
void bench_quantized(kiln::quant::StorageType type, int64_t m, int64_t k, int64_t n, int reps, int threads,
                     const kiln::bench::Bf16Ceiling& c) {
  using kiln::cpu_kernels::Bf16Path;
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
  const kiln::Tensor x = kiln::bench::uniform_tensor({m, k}, kiln::bfloat16, 1.0f, 1);
  const kiln::quant::QuantizedTensor wq = kiln::bench::quantize_weight(
      kiln::bench::uniform_tensor({n, k}, kiln::float32, 1.0f / std::sqrt(static_cast<float>(k)), 2), type);
  const kiln::Tensor dense = wq.dequantize().to(kiln::bfloat16);
  kiln::set_weight_prepacking(kiln::WeightPrepacking::Always);
  const kiln::Tensor dense_fma = dense.clone();  // never packed: the fma32 path reads it in place
  Stats s_default, s_fma, s_onednn, s_dense, s_dense_fma;
  kiln::Tensor y_default, y_fma, y_onednn, y_dense, y_dense_fma;
  const auto run_default = [&] { y_default = kiln::linear(x, wq); };
  const auto run_fma = [&] { on_path(Bf16Path::Fma32, [&] { y_fma = kiln::linear(x, wq); }); };
  const auto run_onednn = [&] { on_path(Bf16Path::Onednn, [&] { y_onednn = kiln::linear(x, wq); }); };
  const auto run_dense = [&] { y_dense = kiln::linear(x, dense); };
  const auto run_dense_fma = [&] {
    on_path(Bf16Path::Fma32, [&] { y_dense_fma = kiln::linear(x, dense_fma); });
  };
  const std::function<void()> warm_ups[] = {run_default, run_fma, run_onednn, run_dense, run_dense_fma};
  for (const auto& f : warm_ups) time_of(f);
  for (int r = 0; r < reps; ++r) {
    s_default.add(flop, time_of(run_default), threads);
    s_fma.add(flop, time_of(run_fma), threads);
    s_onednn.add(flop, time_of(run_onednn), threads);
    s_dense.add(flop, time_of(run_dense), threads);
    s_dense_fma.add(flop, time_of(run_dense_fma), threads);
  }
  const double fma_ceiling = c.rates.fma32, best = c.gflops;
  std::printf(
      "%5lld x %5lld x %5lld %-7s | default (%s) %4.0f med %4.0f | fma32 %4.0f med %4.0f = %3.0f%% of f32 "
      "FMA "
      "%.0f, %3.0f%% of best %.0f | onednn-bf16 %4.0f med %4.0f = %3.0f%% of best | dense bf16: default "
      "%4.0f "
      "med %4.0f, fma32 %4.0f med %4.0f | quantized / dense on fma32 %.2f | fma32 vs onednn-bf16 max rel "
      "diff "
      "%.1e\n",
      static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
      std::string(kiln::quant::type_name(type)).c_str(),
      kiln::cpu_kernels::bf16_path_name(kiln::cpu_kernels::bf16_path()), s_default.best(), s_default.median(),
      s_fma.best(), s_fma.median(), 100 * s_fma.best() / fma_ceiling, fma_ceiling, 100 * s_fma.best() / best,
      best, s_onednn.best(), s_onednn.median(), 100 * s_onednn.best() / best, s_dense.best(),
      s_dense.median(), s_dense_fma.best(), s_dense_fma.median(), s_fma.best() / s_dense_fma.best(),
      max_rel_diff(y_fma, y_onednn));
  std::fflush(stdout);
}

// kiln::linear on an x whose rows start 424 bytes past a cache line (a view into a wider buffer, as an
// input mapped from a file can be) against the same values 64-byte aligned, interleaved, bf16, prepacked.
void bench_offset(int64_t m, int64_t k, int64_t n, int reps, int threads) {
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
  constexpr int64_t kOffset = 212;  // elements: 424 bytes
  const kiln::Tensor wide = kiln::bench::uniform_tensor({m * k + kOffset}, kiln::bfloat16, 1.0f, 1);
  const kiln::Tensor x_offset = wide.narrow(0, kOffset, m * k).view({m, k});
  const kiln::Tensor x = x_offset.clone();
  const kiln::Tensor w =
      kiln::bench::uniform_tensor({n, k}, kiln::bfloat16, 1.0f / std::sqrt(static_cast<float>(k)), 2);
  kiln::set_weight_prepacking(kiln::WeightPrepacking::Always);
  kiln::Tensor y, y_offset;
  const auto run_aligned = [&] {
    y = kiln::linear(x, w);
    kiln::synchronize();
  };
  const auto run_offset = [&] {
    y_offset = kiln::linear(x_offset, w);
    kiln::synchronize();
  };
  run_aligned();
  run_offset();
  Stats s_aligned, s_offset;
  for (int r = 0; r < reps; ++r) {
    s_aligned.add(flop, time_of(run_aligned), threads);
    s_offset.add(flop, time_of(run_offset), threads);
  }
  std::printf(
      "%5lld x %5lld x %5lld bf16 | x aligned %5.0f med %5.0f | x 424 B past a line %5.0f med %5.0f = "
      "%.3f of aligned | max rel diff %.1e\n",
      static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n), s_aligned.best(),
      s_aligned.median(), s_offset.best(), s_offset.median(), s_offset.best() / s_aligned.best(),
      max_rel_diff(y_offset, y));
  std::fflush(stdout);
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string line;
  std::getline(f, line);
  return line + "\n";
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const std::string which = argc > 2 ? argv[2] : "all";
  std::printf(
      "GFLOP/s, best of %d (%% of the measured ceiling: bf16 the best instruction's, f32 f32 FMA's) and "
      "median; oneDNN = raw matmul with B prepacked, same shapes\n",
      reps);
  std::printf("threads %d, load average %s", omp_get_max_threads(), load_average().c_str());
  const kiln::bench::Bf16Ceiling ceiling = kiln::bench::measure_bf16_ceiling();
  kiln::bench::print_ceiling(ceiling);
  if (which == "offset") {
    const int64_t offset_shapes[][3] = {{4096, 3072, 3072}, {4096, 12288, 3072}, {666, 4096, 1536}};
    for (const auto& s : offset_shapes) bench_offset(s[0], s[1], s[2], reps, omp_get_max_threads());
    return 0;
  }
  if (which == "quantized") {
    const int64_t shapes[][3] = {{4096, 3072, 3072}, {4096, 3072, 12288}, {4096, 12288, 3072}};
    for (const auto type : {kiln::quant::StorageType::Q8_0, kiln::quant::StorageType::F8_E4M3})
      for (const auto& s : shapes)
        bench_quantized(type, s[0], s[1], s[2], reps, omp_get_max_threads(), ceiling);
    return 0;
  }
  if (which == "paths") {
    const int64_t path_shapes[][3] = {
        {4096, 3072, 3072}, {4096, 3072, 12288}, {4096, 12288, 3072}, {1024, 3072, 3072}};
    for (const auto& s : path_shapes) bench_paths(s[0], s[1], s[2], reps, omp_get_max_threads(), ceiling);
    return 0;
  }
  const int64_t shapes[][3] = {{4096, 3072, 3072}, {4096, 3072, 12288}, {4096, 12288, 3072}};
  for (kiln::DType dtype : {kiln::bfloat16, kiln::float32}) {
    if (which != "all" && which != (dtype == kiln::bfloat16 ? "bf16" : "f32")) continue;
    for (const auto& s : shapes) bench(s[0], s[1], s[2], dtype, reps, omp_get_max_threads(), ceiling);
  }
  return 0;
}
