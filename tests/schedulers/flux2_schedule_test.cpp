// FLUX.2's schedule against diffusers (tools/goldens/flux2.py -> tests/data/goldens/flux2/scheduler.json):
// Flux2Pipeline's compute_empirical_mu on many (image_seq_len, steps) pairs, both sides of its 4300-token
// switch, and the sigmas and timesteps the FLUX.2 scheduler makes with it for several image sizes and step
// counts, bit for bit.
#include <gtest/gtest.h>

#include "kiln/io/json_config.h"
#include "kiln/schedulers/flow_match_euler.h"
#include "kiln/schedulers/timestep_shift.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const io::JsonConfig& refs() {
  static const io::JsonConfig doc = io::JsonConfig::load(testing::data_path("goldens/flux2/scheduler.json"));
  return doc;
}

TEST(Flux2Schedule, EmpiricalMuMatchesDiffusers) {
  const io::JsonConfig mu = refs().object("compute_empirical_mu");
  int checked = 0;
  for (const std::string& key : mu.keys()) {
    const auto sep = key.find('_');
    const int64_t seq = std::stoll(key.substr(0, sep));
    const int steps = std::stoi(key.substr(sep + 1));
    EXPECT_EQ(compute_empirical_mu(seq, steps), mu.get<double>(key)) << key;
    ++checked;
  }
  EXPECT_EQ(checked, 19 * 13);
  // Above 4300 tokens the step count no longer matters; below, it does.
  EXPECT_EQ(compute_empirical_mu(4301, 4), compute_empirical_mu(4301, 50));
  EXPECT_NE(compute_empirical_mu(4300, 4), compute_empirical_mu(4300, 50));
}

TEST(Flux2Schedule, SigmasAndTimestepsMatchDiffusers) {
  // The tiny pipelines ship FLUX.2-dev's scheduler config (FLUX.1-dev's: shift 3, dynamic shifting).
  const auto scheduler_dir = testing::data_path("models/flux2-tiny-dev/scheduler");
  const io::JsonConfig schedules = refs().object("schedules");
  ASSERT_EQ(schedules.keys().size(), 30u);
  for (const std::string& name : schedules.keys()) {
    const io::JsonConfig c = schedules.object(name);
    const int steps = c.get<int>("steps");
    const double mu = compute_empirical_mu(c.get<int64_t>("image_seq_len"), steps);
    EXPECT_EQ(mu, c.get<double>("mu")) << name;
    auto s = FlowMatchEulerDiscreteScheduler::from_pretrained(scheduler_dir);
    s.set_timesteps(steps, flux_sigmas(steps), mu);
    EXPECT_EQ(s.sigmas(), c.get<std::vector<float>>("sigmas")) << name;
    EXPECT_EQ(s.timesteps(), c.get<std::vector<float>>("timesteps")) << name;
  }
}

}  // namespace
}  // namespace kiln
