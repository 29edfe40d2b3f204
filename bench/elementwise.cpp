// Elementwise ops on a DiT-sized bfloat16 activation (4096 tokens x 3072 channels, 24 MiB): the unfused
// adaLN-style chain gelu_tanh(x * scale + shift) with per-channel scale/shift (three passes, each reading and
// writing the whole tensor), each of its ops alone, and the float32 <-> bfloat16 casts.
// "GB/s" counts the bytes each op must move (inputs read once + output written once; the per-channel
// vectors are negligible). This machine's DRAM gives about 50 GB/s on 2 threads and 30 GB/s on 1
// (shared/reference/cpu-limits.md), so an op near those figures is memory-bound as it should be.
// Usage: bench_elementwise [--benchmark_filter=...]; OMP_NUM_THREADS=1 for one core.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/elementwise_op.h"
#include "backends/cpu/isa_dispatch.h"
#include "kiln/ops/elementwise.h"

namespace kiln::cpu_kernels {
KILN_ISA_DECLARE(void, ew_float_run,
                 (EwOp op, const EwParams& params, const EwOperand* inputs, char* out, int64_t out_stride,
                  DType out_dtype, int64_t n));
}  // namespace kiln::cpu_kernels

namespace {

constexpr int64_t kRows = 4096, kCols = 3072;

kiln::Tensor noise(const kiln::Shape& shape, float amplitude, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(kiln::shape_numel(shape)));
  uint32_t s = seed;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = amplitude * (static_cast<float>(s >> 8) / 16777216.0f * 2.0f - 1.0f);
  }
  return kiln::Tensor::from_vector(v, shape);
}

struct Inputs {
  kiln::Tensor x = noise({kRows, kCols}, 3.0f, 1).to(kiln::bfloat16);
  kiln::Tensor scale = noise({kCols}, 1.0f, 2).to(kiln::bfloat16);
  kiln::Tensor shift = noise({kCols}, 0.5f, 3).to(kiln::bfloat16);
  kiln::Tensor x_f32 = noise({kRows, kCols}, 3.0f, 1);
};

const Inputs& inputs() {
  static const Inputs in;
  return in;
}

// Ops may run asynchronously on the device stream: reading the result on the host waits for it.
const void* wait(const kiln::Tensor& t) {
  return t.dtype() == kiln::float32 ? static_cast<const void*>(t.data<float>())
                                    : static_cast<const void*>(t.data<kiln::bf16_t>());
}

void report(benchmark::State& state, double bytes_per_iteration) {
  state.counters["GB/s"] = benchmark::Counter(
      bytes_per_iteration * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(kiln::cpu_kernels::cpu_isa_name());
}

constexpr double kBf16Bytes = static_cast<double>(kRows * kCols * 2);

void BM_Chain_ScaleShiftGeluTanh_bf16(benchmark::State& state) {
  const Inputs& in = inputs();
  for (auto _ : state) {
    kiln::Tensor y = kiln::gelu(in.x * in.scale + in.shift, kiln::GeluApproximate::Tanh);
    benchmark::DoNotOptimize(wait(y));
  }
  report(state, 3 * 2 * kBf16Bytes);  // three passes, each reading and writing the tensor
}
BENCHMARK(BM_Chain_ScaleShiftGeluTanh_bf16)->Unit(benchmark::kMillisecond)->MinTime(0.5)->UseRealTime();

void BM_MulPerChannel_bf16(benchmark::State& state) {
  const Inputs& in = inputs();
  for (auto _ : state) benchmark::DoNotOptimize(wait(in.x * in.scale));
  report(state, 2 * kBf16Bytes);
}
BENCHMARK(BM_MulPerChannel_bf16)->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseRealTime();

void BM_AddSameShape_bf16(benchmark::State& state) {
  const Inputs& in = inputs();
  for (auto _ : state) benchmark::DoNotOptimize(wait(in.x + in.x));
  report(state, 3 * kBf16Bytes);
}
BENCHMARK(BM_AddSameShape_bf16)->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseRealTime();

void BM_GeluTanh_bf16(benchmark::State& state) {
  const Inputs& in = inputs();
  for (auto _ : state) benchmark::DoNotOptimize(wait(kiln::gelu(in.x, kiln::GeluApproximate::Tanh)));
  report(state, 2 * kBf16Bytes);
}
BENCHMARK(BM_GeluTanh_bf16)->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseRealTime();

// The kernel alone (no allocation or dispatch) on 16 Ki bfloat16 elements that stay in L1/L2: the compute
// ceiling of each op on one core. Repeated; "min" is the least disturbed run on a shared host.
void BM_KernelInCache_bf16(benchmark::State& state) {
  using namespace kiln::cpu_kernels;
  const auto op = static_cast<EwOp>(state.range(0));
  const kiln::Tensor x = inputs().x.narrow(0, 0, 16).contiguous();  // 3072 x 16 elements
  const kiln::Tensor y = kiln::Tensor::empty(x.shape(), kiln::bfloat16);
  const EwOperand in[2] = {{static_cast<const char*>(x.raw_data()), 2, kiln::bfloat16},
                           {static_cast<const char*>(x.raw_data()), 2, kiln::bfloat16}};
  const auto fn = KILN_ISA_CALL(ew_float_run);
  for (auto _ : state) {
    fn(op, EwParams{}, in, static_cast<char*>(y.raw_data()), 2, kiln::bfloat16, x.numel());
    benchmark::ClobberMemory();
  }
  state.counters["Gelem/s"] =
      benchmark::Counter(static_cast<double>(x.numel()) * static_cast<double>(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_KernelInCache_bf16)
    ->ArgName("op")
    ->Arg(static_cast<int>(kiln::cpu_kernels::EwOp::Add))
    ->Arg(static_cast<int>(kiln::cpu_kernels::EwOp::Exp))
    ->Arg(static_cast<int>(kiln::cpu_kernels::EwOp::Tanh))
    ->Arg(static_cast<int>(kiln::cpu_kernels::EwOp::Silu))
    ->Arg(static_cast<int>(kiln::cpu_kernels::EwOp::Gelu))
    ->Arg(static_cast<int>(kiln::cpu_kernels::EwOp::GeluTanh))
    ->MinTime(0.05)
    ->Repetitions(5)
    ->ComputeStatistics("min",
                        [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); })
    ->ReportAggregatesOnly(true);

void BM_Silu_bf16(benchmark::State& state) {
  const Inputs& in = inputs();
  for (auto _ : state) benchmark::DoNotOptimize(wait(kiln::silu(in.x)));
  report(state, 2 * kBf16Bytes);
}
BENCHMARK(BM_Silu_bf16)->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseRealTime();

void BM_Cast_bf16_to_f32(benchmark::State& state) {
  const Inputs& in = inputs();
  for (auto _ : state) benchmark::DoNotOptimize(wait(in.x.to(kiln::float32)));
  report(state, 3 * kBf16Bytes);  // 2 bytes read + 4 written per element
}
BENCHMARK(BM_Cast_bf16_to_f32)->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseRealTime();

void BM_Cast_f32_to_bf16(benchmark::State& state) {
  const Inputs& in = inputs();
  for (auto _ : state) benchmark::DoNotOptimize(wait(in.x_f32.to(kiln::bfloat16)));
  report(state, 3 * kBf16Bytes);
}
BENCHMARK(BM_Cast_f32_to_bf16)->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
