// How the diffusers pipelines choose the sigmas and the resolution-dependent shift `mu` they pass to
// FlowMatchEulerDiscreteScheduler::set_timesteps. All in float64, as the Python code computes them.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

// numpy.linspace(start, stop, num) in float64, element for element (endpoint included).
std::vector<double> linspace(double start, double stop, int64_t num);
// The sigmas FluxPipeline and Flux2Pipeline pass: np.linspace(1.0, 1 / n, n).
std::vector<double> flux_sigmas(int num_inference_steps);

// FluxPipeline's calculate_shift: mu linear in the packed image sequence length (image_seq_len =
// (height / 16) * (width / 16)); the defaults are the FLUX.1 scheduler_config.json values.
double calculate_shift(int64_t image_seq_len, int64_t base_seq_len = 256, int64_t max_seq_len = 4096,
                       double base_shift = 0.5, double max_shift = 1.15);
// Flux2Pipeline's compute_empirical_mu: depends on the sequence length and, below 4300 tokens, on the number
// of steps.
double compute_empirical_mu(int64_t image_seq_len, int num_steps);

}  // namespace kiln
