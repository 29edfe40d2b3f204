// The SD 1.5 / SDXL samplers (Euler, Euler ancestral, DPM++ 2M, DDIM, PNDM) against diffusers 0.42.1
// (tools/goldens/schedulers.py -> tests/data/goldens/schedulers/<case>.safetensors). Each case is built the
// way a pipeline swaps samplers (scheduler_from_config on a real scheduler_config.json), and every step is
// given diffusers' own sample and model output, so a mismatch points at the step that made it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>

#include "kiln/io/json_config.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops/elementwise.h"
#include "kiln/pipelines/generator.h"
#include "kiln/schedulers/ddim.h"
#include "kiln/schedulers/dpm_solver_multistep.h"
#include "kiln/schedulers/euler_ancestral_discrete.h"
#include "kiln/schedulers/euler_discrete.h"
#include "kiln/schedulers/pndm.h"
#include "kiln/schedulers/scheduler_factory.h"
#include "support/test_data.h"

namespace kiln {
namespace {

// Steps and the forward process are float32 tensor arithmetic in diffusers' operation order, so most steps
// match bit for bit (StepsMatchDiffusers counts them). The per-step coefficients are float32 sqrt / log / exp
// of 0-dim tensors, which torch computes with its own vectorized math: not always correctly rounded (torch's
// sqrt of 0.856821358 is one ulp below IEEE's), so a coefficient can be one float32 ulp off libm's and the
// samples then differ by ~1e-7 relative.
constexpr double kSampleRtol = 1e-6;
constexpr double kSampleAtol = 1e-6;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct Case {
  std::string name;
  io::SafetensorsFile file;
  std::map<std::string, std::string> meta;

  explicit Case(const std::string& n)
      : name(n),
        file(testing::data_path("goldens/schedulers/" + n + ".safetensors")),
        meta(file.metadata()) {}
  io::JsonConfig json(const std::string& key) const {
    return io::JsonConfig::parse(meta.at(key), name + ":" + key);
  }
  int integer(const std::string& key) const { return std::stoi(meta.at(key)); }
  std::vector<float> floats(const std::string& key) const { return file.tensor(key).to_vector<float>(); }
  std::unique_ptr<DiscreteScheduler> scheduler() const {
    auto s = scheduler_from_config(meta.at("class"), json("base_config"), json("overrides"));
    s->set_timesteps(integer("num_inference_steps"));
    return s;
  }
};

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(testing::data_path("goldens/schedulers")))
    names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

const std::vector<float>* sigmas_of(const DiscreteScheduler& s) {
  if (auto* e = dynamic_cast<const EulerDiscreteScheduler*>(&s)) return &e->sigmas();
  if (auto* a = dynamic_cast<const EulerAncestralDiscreteScheduler*>(&s)) return &a->sigmas();
  if (auto* d = dynamic_cast<const DPMSolverMultistepScheduler*>(&s)) return &d->sigmas();
  return nullptr;
}

bool is_euler_karras(const Case& c) {
  return c.meta.at("class") == "EulerDiscreteScheduler" && c.name.find("karras") != std::string::npos;
}

TEST(DiscreteSchedulers, AllCasesPresent) {
  EXPECT_EQ(case_names().size(), 27u);
}

TEST(DiscreteSchedulers, SchedulesMatchDiffusers) {
  for (const std::string& name : case_names()) {
    SCOPED_TRACE(name);
    const Case c(name);
    const auto s = c.scheduler();
    EXPECT_EQ(s->class_name(), c.meta.at("class"));
    EXPECT_EQ(s->alphas_cumprod(), c.floats("alphas_cumprod"));
    const std::vector<float> expected = c.floats("timesteps");
    ASSERT_EQ(s->timesteps().size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      if (is_euler_karras(c)) {
        // Karras timesteps interpolate in float32 log sigma; numpy's SIMD logf (SVML on AVX-512) is not
        // correctly rounded and differs by an ulp from libm on ~20% of the training sigmas, which moves a
        // fractional timestep by at most a few float32 ulps.
        EXPECT_NEAR(s->timesteps()[i], expected[i], 4e-4) << "timestep " << i;
      } else {
        EXPECT_EQ(s->timesteps()[i], expected[i]) << "timestep " << i;
      }
    }
    if (c.file.contains("sigmas")) {
      const std::vector<float>* sigmas = sigmas_of(*s);
      ASSERT_NE(sigmas, nullptr);
      EXPECT_EQ(*sigmas, c.floats("sigmas"));
    } else {
      EXPECT_EQ(sigmas_of(*s), nullptr);
    }
    EXPECT_EQ(static_cast<float>(s->init_noise_sigma()), c.floats("init_noise_sigma").at(0));
  }
}

TEST(DiscreteSchedulers, StepsMatchDiffusers) {
  int steps = 0;
  int exact = 0;
  for (const std::string& name : case_names()) {
    SCOPED_TRACE(name);
    const Case c(name);
    auto s = c.scheduler();
    std::unique_ptr<Generator> gen;
    NoiseDraw draw;
    if (c.meta.at("seed") != "null") {
      gen = std::make_unique<Generator>(std::stoull(c.meta.at("seed")));
      draw = [&gen](const Shape& shape, DType dtype) { return randn_tensor(shape, *gen, dtype); };
    }
    for (int i = 0; i < s->num_inference_steps(); ++i) {
      SCOPED_TRACE("step " + std::to_string(i));
      const Tensor sample = c.file.tensor("sample." + std::to_string(i));
      const Tensor scaled = s->scale_model_input(sample, i);
      const std::string scaled_key = "scaled." + std::to_string(i);
      if (c.file.contains(scaled_key))
        EXPECT_TRUE(testing::all_close(scaled, c.file.tensor(scaled_key), kSampleRtol, kSampleAtol));
      else
        EXPECT_TRUE(testing::all_close(scaled, sample, 0.0, 0.0));
      const Tensor out = s->step(c.file.tensor("model_output." + std::to_string(i)), i, sample, draw);
      EXPECT_EQ(out.dtype(), float32);
      const Tensor expected = c.file.tensor("sample." + std::to_string(i + 1));
      EXPECT_TRUE(testing::all_close(out, expected, kSampleRtol, kSampleAtol));
      if (testing::all_close(out, expected, 0.0, 0.0)) ++exact;
      ++steps;
    }
  }
  EXPECT_EQ(steps, 292);
  // The operation order is diffusers': all but the few steps whose coefficient torch rounds differently are
  // bit-exact (288 of 292 where the goldens were made).
  EXPECT_GE(exact, 280) << exact << " of " << steps << " steps bit-exact";
}

TEST(DiscreteSchedulers, ImageToImageMatchesDiffusers) {
  for (const std::string& name : case_names()) {
    SCOPED_TRACE(name);
    const Case c(name);
    const auto s = c.scheduler();
    const int start = s->img2img_start_index(std::stod(c.meta.at("strength")));
    EXPECT_EQ(start, c.integer("img2img_start"));
    const std::vector<float> expected = c.floats("img2img_timesteps");
    ASSERT_EQ(static_cast<size_t>(s->num_inference_steps() - start), expected.size());
    if (!is_euler_karras(c)) {
      for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(s->timesteps()[start + i], expected[i]);
    }
    const Tensor noised = s->scale_noise(c.file.tensor("add_noise.sample"), c.integer("add_noise_index"),
                                         c.file.tensor("add_noise.noise"));
    EXPECT_TRUE(testing::all_close(noised, c.file.tensor("add_noise.out"), kSampleRtol, kSampleAtol));
  }
  // StableDiffusionImg2ImgPipeline.get_timesteps: int(n * strength) steps from the end.
  EXPECT_EQ(img2img_start_index(25, 0.6), 10);
  EXPECT_EQ(img2img_start_index(7, 1.0), 0);
  EXPECT_EQ(img2img_start_index(7, 0.0), 7);
  EXPECT_EQ(img2img_start_index(10, 0.29), 8);  // 10 * 0.29 = 2.9 truncates to 2
  EXPECT_THROW(img2img_start_index(10, 1.5), Error);
}

TEST(DiscreteSchedulers, CloneKeepsHistoryApart) {
  // Two calls from one configured DPM++ 2M: the second-order update of one must not see the other's history.
  const Case c("dpmpp_2m_sd15_n7");
  const auto configured = c.scheduler();
  auto a = configured->clone_discrete();
  auto b = configured->clone_discrete();
  const Tensor x0 = c.file.tensor("sample.0");
  const Tensor m0 = c.file.tensor("model_output.0");
  const Tensor x1 = a->step(m0, 0, x0);
  const Tensor other = mul(m0, -3.0);
  b->step(other, 0, x0);  // a different first output in the other call
  const Tensor x2 = a->step(c.file.tensor("model_output.1"), 1, x1);
  EXPECT_TRUE(testing::all_close(x2, c.file.tensor("sample.2"), kSampleRtol, kSampleAtol));
  // Its own history makes b's second step differ from a's.
  const Tensor b2 = b->step(c.file.tensor("model_output.1"), 1, x1);
  EXPECT_FALSE(testing::all_close(b2, x2, 1e-3, 1e-3));
  // The configured scheduler itself was not stepped: a fresh first step is first order again.
  auto again = configured->clone();
  EXPECT_TRUE(
      testing::all_close(again->step(m0, 0, x0), c.file.tensor("sample.1"), kSampleRtol, kSampleAtol));
  // set_timesteps clears the history: step 1 cannot follow without step 0.
  a->set_timesteps(7);
  const std::string order = error_of([&] {
    a->step(m0, 0, x0);
    a->step(m0, 2, x0);
  });
  EXPECT_NE(order.find("steps must be taken in order"), std::string::npos) << order;

  // PNDM keeps its outputs per call as well.
  const Case p("pndm_sd15_n7");
  const auto pndm = p.scheduler();
  auto p1 = pndm->clone();
  auto p2 = pndm->clone();
  for (int i = 0; i < 3; ++i)
    p2->step(mul(p.file.tensor("model_output." + std::to_string(i)), 2.0), i, p.file.tensor("sample.0"));
  for (int i = 0; i < 3; ++i) {
    const Tensor out = p1->step(p.file.tensor("model_output." + std::to_string(i)), i,
                                p.file.tensor("sample." + std::to_string(i)));
    EXPECT_TRUE(
        testing::all_close(out, p.file.tensor("sample." + std::to_string(i + 1)), kSampleRtol, kSampleAtol));
  }
}

TEST(DiscreteSchedulers, AncestralNeedsNoise) {
  const Case c("euler_a_sdxl_n7");
  auto s = c.scheduler();
  const std::string msg =
      error_of([&] { s->step(c.file.tensor("model_output.0"), 0, c.file.tensor("sample.0")); });
  EXPECT_NE(msg.find("EulerAncestralDiscreteScheduler"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NoiseDraw"), std::string::npos) << msg;
}

TEST(DiscreteSchedulers, FactoryNamesAndSwaps) {
  const io::JsonConfig sd15 = Case("pndm_sd15_n7").json("base_config");
  EXPECT_EQ(scheduler_from_config("euler", sd15)->kind(), DiscreteSchedulerKind::Euler);
  EXPECT_EQ(scheduler_from_config("euler_a", sd15)->kind(), DiscreteSchedulerKind::EulerAncestral);
  EXPECT_EQ(scheduler_from_config("ddim", sd15)->kind(), DiscreteSchedulerKind::DDIM);
  EXPECT_EQ(scheduler_from_config("pndm", sd15)->kind(), DiscreteSchedulerKind::PNDM);
  const auto dpm = scheduler_from_config("dpmpp_2m", sd15);
  EXPECT_FALSE(dpm->config().use_karras_sigmas);
  const auto karras = scheduler_from_config("dpmpp_2m_karras", sd15);
  EXPECT_EQ(karras->kind(), DiscreteSchedulerKind::DPMSolverMultistep);
  EXPECT_TRUE(karras->config().use_karras_sigmas);
  EXPECT_TRUE(scheduler_from_config("DPMSolverMultistepScheduler", sd15, R"({"use_karras_sigmas": true})")
                  ->config()
                  .use_karras_sigmas);
  // The base's keys carry over; keys it does not set take the new class's defaults (PNDM's default spacing
  // "leading" is not in SD 1.5's file, so Euler gets its own "linspace"), and DDIM's set_alpha_to_one comes
  // from the file.
  const auto euler = scheduler_from_config("euler", sd15);
  EXPECT_EQ(euler->config().timestep_spacing, TimestepSpacing::Linspace);
  EXPECT_EQ(euler->config().steps_offset, 1);
  EXPECT_EQ(euler->config().beta_schedule, BetaSchedule::ScaledLinear);
  EXPECT_FALSE(scheduler_from_config("ddim", sd15)->config().set_alpha_to_one);
  EXPECT_TRUE(scheduler_from_config("ddim", io::JsonConfig())->config().set_alpha_to_one);
  EXPECT_EQ(scheduler_from_config("ddim", io::JsonConfig())->config().timestep_spacing,
            TimestepSpacing::Leading);

  const std::string unknown = error_of([&] { scheduler_from_config("lms", sd15); });
  EXPECT_NE(unknown.find("\"lms\""), std::string::npos) << unknown;
  for (const std::string& n : scheduler_names()) EXPECT_NE(unknown.find(n), std::string::npos) << unknown;
  EXPECT_EQ(scheduler_names().size(), 11u);
}

TEST(DiscreteSchedulers, LoadFromFolder) {
  const std::string dir = testing::temp_dir("discrete_scheduler_config");
  {
    // As diffusers saves a DPM-Solver config: lambda_min_clipped is -Infinity, which is not JSON.
    std::ofstream f(dir + "/scheduler_config.json");
    f << R"({"_class_name": "DPMSolverMultistepScheduler", "_diffusers_version": "0.42.1",
             "algorithm_type": "dpmsolver++", "beta_end": 0.012, "beta_schedule": "scaled_linear",
             "beta_start": 0.00085, "lambda_min_clipped": -Infinity, "solver_order": 2,
             "steps_offset": 1, "timestep_spacing": "leading", "use_karras_sigmas": true,
             "variance_type": null, "some_future_key": [1, 2]})";
  }
  const auto s = load_scheduler(dir);
  EXPECT_EQ(s->kind(), DiscreteSchedulerKind::DPMSolverMultistep);
  EXPECT_TRUE(s->config().use_karras_sigmas);
  EXPECT_EQ(s->config().timestep_spacing, TimestepSpacing::Leading);
  EXPECT_EQ(s->config().beta_end, 0.012);
  {
    std::ofstream f(dir + "/scheduler_config.json");
    f << R"({"_class_name": "LMSDiscreteScheduler"})";
  }
  const std::string lms = error_of([&] { load_scheduler(dir); });
  EXPECT_NE(lms.find("LMSDiscreteScheduler"), std::string::npos) << lms;
  EXPECT_NE(lms.find("scheduler_config.json"), std::string::npos) << lms;
  EXPECT_THROW(load_scheduler(dir + "/missing"), Error);
}

TEST(DiscreteSchedulers, RefusesUnsupportedConfigs) {
  struct Bad {
    const char* name;
    const char* overrides;
    const char* expect;  // in the message
  };
  const Bad bad[] = {
      {"euler", R"({"trained_betas": [0.1, 0.2]})", "trained_betas"},
      {"euler", R"({"beta_schedule": "sigmoid"})", "sigmoid"},
      {"euler", R"({"prediction_type": "flow_prediction"})", "prediction_type"},
      {"euler", R"({"timestep_spacing": "karras"})", "timestep_spacing"},
      {"euler", R"({"interpolation_type": "log_linear"})", "interpolation_type"},
      {"euler", R"({"use_exponential_sigmas": true})", "use_exponential_sigmas"},
      {"euler", R"({"use_beta_sigmas": true})", "use_beta_sigmas"},
      {"euler", R"({"rescale_betas_zero_snr": true})", "rescale_betas_zero_snr"},
      {"euler", R"({"final_sigmas_type": "sigma_max"})", "final_sigmas_type"},
      {"euler", R"({"prediction_type": "v_prediction", "timestep_type": "continuous"})", "timestep_type"},
      {"euler_a", R"({"prediction_type": "sample"})", "prediction_type"},
      {"dpmpp_2m", R"({"algorithm_type": "sde-dpmsolver++"})", "algorithm_type"},
      {"dpmpp_2m", R"({"algorithm_type": "dpmsolver"})", "dpmsolver"},
      {"dpmpp_2m", R"({"solver_order": 3})", "solver_order"},
      {"dpmpp_2m", R"({"thresholding": true})", "thresholding"},
      {"dpmpp_2m", R"({"use_lu_lambdas": true})", "use_lu_lambdas"},
      {"dpmpp_2m", R"({"variance_type": "learned_range"})", "variance_type"},
      {"dpmpp_2m", R"({"lambda_min_clipped": -5.1})", "lambda_min_clipped"},
      {"ddim", R"({"thresholding": true})", "thresholding"},
      {"pndm", R"({"skip_prk_steps": false})", "skip_prk_steps"},
      {"pndm", R"({"prediction_type": "sample"})", "prediction_type"},
      {"ddim", R"({"steps_offset": "1"})", "steps_offset"},
  };
  for (const Bad& b : bad) {
    const std::string msg = error_of([&] { scheduler_from_config(b.name, io::JsonConfig(), b.overrides); });
    EXPECT_NE(msg.find(b.expect), std::string::npos) << b.name << " " << b.overrides << ": " << msg;
  }
  // Keys a class does not have are ignored, as diffusers ignores them: PNDM has no Karras sigmas.
  EXPECT_NO_THROW(scheduler_from_config("pndm", io::JsonConfig(), R"({"use_karras_sigmas": true, "x": 1})"));
  EXPECT_NO_THROW(scheduler_from_config("ddim", io::JsonConfig(), R"({"skip_prk_steps": false})"));
}

TEST(DiscreteSchedulers, RefusesBadCalls) {
  const Case c("ddim_sd15_n7");
  auto fresh = scheduler_from_config("ddim", c.json("base_config"));
  const Tensor x = Tensor::zeros({2, 3}, float32);
  EXPECT_NE(error_of([&] { fresh->step(x, 0, x); }).find("set_timesteps"), std::string::npos);
  EXPECT_NE(error_of([&] { fresh->img2img_start_index(0.5); }).find("set_timesteps"), std::string::npos);
  EXPECT_THROW(fresh->set_timesteps(0), Error);
  EXPECT_NE(error_of([&] { fresh->set_timesteps(1001); }).find("num_train_timesteps"), std::string::npos);
  fresh->set_timesteps(4);
  EXPECT_NE(error_of([&] { fresh->step(x, 4, x); }).find("[0, 4)"), std::string::npos);
  EXPECT_THROW(fresh->scale_model_input(x, -1), Error);
  const std::string shape = error_of([&] { fresh->step(x, 0, Tensor::zeros({3, 2}, float32)); });
  EXPECT_NE(shape.find("[2, 3]"), std::string::npos) << shape;
  EXPECT_NE(shape.find("[3, 2]"), std::string::npos) << shape;
  EXPECT_NE(error_of([&] {
              fresh->step(Tensor::zeros({2, 3}, int64), 0, x);
            }).find("int64"),
            std::string::npos);
}

TEST(DiscreteSchedulers, SixteenBitLatentsKeepTheirDtype) {
  // A bfloat16 UNet's output: the step computes in float32 and returns the model output's dtype.
  const Case c("euler_sdxl_n7");
  auto s = c.scheduler();
  const Tensor x = c.file.tensor("sample.0").to(bfloat16);
  const Tensor out = s->step(c.file.tensor("model_output.0").to(bfloat16), 0, x);
  EXPECT_EQ(out.dtype(), bfloat16);
  EXPECT_TRUE(testing::all_close(out.to(float32), c.file.tensor("sample.1"), 2e-2, 2e-2));
  EXPECT_EQ(s->scale_model_input(x, 0).dtype(), bfloat16);
}

}  // namespace
}  // namespace kiln
