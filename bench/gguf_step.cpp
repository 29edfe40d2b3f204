// GGUF-quantized and fp8 weights against bf16 on a FLUX.1-shaped transformer step (bench_util.h's
// flux_shaped_step: real widths, 1 double + 1 single block, random weights, 512x512 with 512 text tokens).
// The same random bf16 weights are quantized to Q8_0, Q4_K and F8_E4M3 (quantize_blocks.h) and loaded through
// load_quantized, as a GGUF or fp8 safetensors file's would be, so they stay quantized.
// Prints per variant: step time (best wall, and its CPU time), the bytes the parameters hold, the process's
// resident memory after the steps and its peak during them (bf16 weights here are owned copies, so bf16's
// prepacked copies add to them; from a file their pages are dropped), and the output's relative max error
// against the bf16 model.
// Usage: bench_gguf_step [repetitions=3] [size=512]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "backends/cpu/cpu_features.h"
#include "bench_util.h"
#include "kiln/quant/storage_type.h"
#include "quantize_blocks.h"

namespace {

using kiln::Shape;
using kiln::Tensor;
using kiln::quant::StorageType;

// VmRSS or VmHWM of this process in MiB.
double proc_status_mib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(std::strlen(key) + 1)) / 1024.0;
  return 0;
}
void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

// The bf16 random weights, with every 2-D weight whose rows are whole blocks offered quantized.
class QuantizedRandomWeights : public kiln::nn::WeightSource {
 public:
  QuantizedRandomWeights(const kiln::nn::WeightSource& inner, StorageType type)
      : inner_(inner), type_(type) {}
  bool contains(const std::string& n) const override { return inner_.contains(n); }
  Shape shape(const std::string& n) const override { return inner_.shape(n); }
  Tensor load(const std::string& n) const override { return inner_.load(n); }
  std::vector<std::string> names() const override { return inner_.names(); }
  std::string description() const override { return inner_.description(); }
  kiln::quant::QuantizedTensor load_quantized(const std::string& n) const override {
    const Shape s = inner_.shape(n);
    const int64_t block = kiln::quant::traits(type_).block_size;
    if (s.size() != 2 || s[1] % block != 0) return {};
    return kiln::bench::quantize_weight(inner_.load(n), type_);
  }

 private:
  const kiln::nn::WeightSource& inner_;
  StorageType type_;
};

double rel_max_error(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(x[i] - y[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(y[i])));
  }
  return err / scale;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 3;
  const int64_t size = argc > 2 ? std::atoll(argv[2]) : 512;
  std::printf(
      "FLUX.1-shaped step (1 double + 1 single block, width 3072), %lldx%lld, 512 text tokens, %s kernels\n",
      static_cast<long long>(size), static_cast<long long>(size), kiln::cpu_kernels::cpu_isa_name());
  std::printf("  %-7s %9s %9s %12s %12s %12s %10s\n", "type", "step ms", "cpu s", "params MiB", "RSS MiB",
              "peak RSS MiB", "err vs bf16");
  Tensor reference;
  for (const char* variant : {"bf16", "Q8_0", "Q4_K", "F8_E4M3"}) {
    kiln::bench::FluxShapedStep flux = kiln::bench::flux_shaped_step(size);
    if (std::string(variant) != "bf16") {
      // Re-load the same random weights (RandomWeights is seeded), offered quantized.
      kiln::bench::RandomWeights plain(*flux.model, kiln::bfloat16);
      const std::string v = variant;
      const QuantizedRandomWeights quantized(plain, v == "Q8_0"   ? StorageType::Q8_0
                                                    : v == "Q4_K" ? StorageType::Q4_K
                                                                  : StorageType::F8_E4M3);
      flux.model->load_weights(quantized, {.dtype = kiln::bfloat16});
    }
    reset_peak_rss();  // the peak of the steps, not of building the weights
    size_t params = 0;
    for (const auto& [name, t] : flux.model->named_parameters())
      if (t->defined()) params += t->nbytes();
    Tensor out;
    const double step = kiln::bench::best_of(reps, [&] { out = flux.forward(); });
    const kiln::bench::Timing cpu = kiln::bench::time_of([&] { flux.forward(); });
    if (!reference.defined()) reference = out.to(kiln::float32);
    std::printf("  %-7s %9.1f %9.2f %12.1f %12.1f %12.1f %10.4f\n", variant, step * 1e3, cpu.cpu,
                static_cast<double>(params) / (1 << 20), proc_status_mib("VmRSS:"), proc_status_mib("VmHWM:"),
                rel_max_error(out.to(kiln::float32), reference));
  }
  return 0;
}
