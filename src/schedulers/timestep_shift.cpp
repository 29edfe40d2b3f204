#include "kiln/schedulers/timestep_shift.h"

#include "kiln/core/error.h"
#include "schedulers/rounded.h"

namespace kiln {

using schedulers_detail::rounded;

std::vector<double> linspace(double start, double stop, int64_t num) {
  KILN_CHECK(num >= 0, "linspace: expected a non-negative number of samples, got " << num);
  std::vector<double> y(static_cast<size_t>(num));
  if (num == 0) return y;
  // numpy: y = arange(num) * (delta / div) + start, the last value replaced by stop.
  const int64_t div = num - 1;
  const double delta = stop - start;
  if (div > 0) {
    const double step = delta / static_cast<double>(div);
    for (int64_t i = 0; i < num; ++i) {
      // numpy divides first when the step underflows to zero (denormal ranges).
      const double scaled = step == 0.0 ? (static_cast<double>(i) / static_cast<double>(div)) * delta
                                        : static_cast<double>(i) * step;
      y[static_cast<size_t>(i)] = rounded(scaled) + start;
    }
    y.back() = stop;
  } else {
    y[0] = rounded(0.0 * delta) + start;
  }
  return y;
}

std::vector<double> flux_sigmas(int num_inference_steps) {
  KILN_CHECK(num_inference_steps >= 1,
             "flux_sigmas: expected num_inference_steps >= 1, got " << num_inference_steps);
  return linspace(1.0, 1.0 / num_inference_steps, num_inference_steps);
}

double calculate_shift(int64_t image_seq_len, int64_t base_seq_len, int64_t max_seq_len, double base_shift,
                       double max_shift) {
  KILN_CHECK(max_seq_len != base_seq_len,
             "calculate_shift: max_image_seq_len and base_image_seq_len are both "
                 << max_seq_len << "; expected different values");
  const double m = (max_shift - base_shift) / static_cast<double>(max_seq_len - base_seq_len);
  const double b = base_shift - rounded(m * static_cast<double>(base_seq_len));
  return rounded(static_cast<double>(image_seq_len) * m) + b;
}

double compute_empirical_mu(int64_t image_seq_len, int num_steps) {
  constexpr double a1 = 8.73809524e-05, b1 = 1.89833333;
  constexpr double a2 = 0.00016927, b2 = 0.45666666;
  const double len = static_cast<double>(image_seq_len);
  if (image_seq_len > 4300) return rounded(a2 * len) + b2;
  const double m_200 = rounded(a2 * len) + b2;
  const double m_10 = rounded(a1 * len) + b1;
  const double a = (m_200 - m_10) / 190.0;
  const double b = m_200 - rounded(200.0 * a);
  return rounded(a * static_cast<double>(num_steps)) + b;
}

}  // namespace kiln
