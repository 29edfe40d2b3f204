// FLUX's RoPE tables (FluxPosEmbed): for each position and axis, cos and sin of position x inv_freq, each
// value repeated for the interleaved pair it rotates. Computed in float64 like diffusers' float64 outer
// product, stored as float32.
#include <cmath>

#include "backends/cpu/register_kernels.h"
#include "runtime/dispatcher.h"

namespace kiln::cpu_kernels {

namespace {

void flux_rope_tables(const runtime::OpCall& call) {
  const Tensor& ids = call.inputs[0];  // float32 [S, axes], contiguous
  const std::vector<int64_t>& axes_dims = call.attrs.get_ints("axes_dims");
  const double theta = call.attrs.get_float("theta");
  const int64_t n_axes = static_cast<int64_t>(axes_dims.size());
  const int64_t seq = ids.size(0), head_dim = call.outputs[0].size(1);
  const float* pos = static_cast<const float*>(ids.raw_data());
  float* c = static_cast<float*>(call.outputs[0].raw_data());
  float* s = static_cast<float*>(call.outputs[1].raw_data());
  int64_t col = 0;
  for (int64_t a = 0; a < n_axes; ++a) {
    const int64_t d = axes_dims[static_cast<size_t>(a)];
    std::vector<double> inv(static_cast<size_t>(d / 2));
    for (int64_t k = 0; k < d / 2; ++k)
      inv[static_cast<size_t>(k)] =
          1.0 / std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(d));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < seq; ++i) {
      const double p = static_cast<double>(pos[i * n_axes + a]);
      for (int64_t k = 0; k < d / 2; ++k) {
        const double angle = p * inv[static_cast<size_t>(k)];
        const float cv = static_cast<float>(std::cos(angle)), sv = static_cast<float>(std::sin(angle));
        const int64_t o = i * head_dim + col + 2 * k;
        c[o] = c[o + 1] = cv;
        s[o] = s[o + 1] = sv;
      }
    }
    col += d;
  }
}

}  // namespace

void register_rope_table_kernels(runtime::KernelRegistry& registry) {
  registry.add("flux_rope_tables", DeviceType::CPU, flux_rope_tables);
}

}  // namespace kiln::cpu_kernels
