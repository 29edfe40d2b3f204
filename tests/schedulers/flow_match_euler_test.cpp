// FlowMatchEulerDiscreteScheduler, calculate_shift, compute_empirical_mu and flux_sigmas against diffusers
// (tools/refs/scheduler.py -> tests/data/refs/scheduler.{json,safetensors}). Schedules and steps must match
// bit for bit: the sigmas decide every denoising update and the timesteps are fed to the transformer.
#include "kiln/schedulers/flow_match_euler.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include "kiln/io/json_config.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const io::JsonConfig& refs() {
  static const io::JsonConfig doc = io::JsonConfig::load(testing::data_path("refs/scheduler.json"));
  return doc;
}

const io::SafetensorsFile& step_refs() {
  static const io::SafetensorsFile file(testing::data_path("refs/scheduler.safetensors"));
  return file;
}

std::vector<float> as_floats(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// The scheduler of reference case `name`, with set_timesteps called as the case records.
FlowMatchEulerDiscreteScheduler scheduler_for(const std::string& name) {
  const io::JsonConfig c = refs().object("cases").object(name);
  FlowMatchEulerDiscreteScheduler s(FlowMatchEulerConfig::from_json(c.object("config")));
  std::optional<std::vector<double>> sigmas;
  if (c.has("input_sigmas")) sigmas = c.get<std::vector<double>>("input_sigmas");
  s.set_timesteps(c.get<int>("num_inference_steps"), sigmas, c.get_optional<double>("mu"));
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FlowMatchEulerRefs, SchedulesMatchDiffusersBitForBit) {
  const io::JsonConfig cases = refs().object("cases");
  int checked = 0;
  for (const std::string& name : cases.keys()) {
    SCOPED_TRACE(name);
    const io::JsonConfig c = cases.object(name);
    const FlowMatchEulerDiscreteScheduler s = scheduler_for(name);
    EXPECT_EQ(s.sigma_min(), static_cast<float>(c.get<double>("sigma_min")));
    EXPECT_EQ(s.sigma_max(), static_cast<float>(c.get<double>("sigma_max")));
    const auto sigmas = as_floats(c.get<std::vector<double>>("sigmas"));
    const auto timesteps = as_floats(c.get<std::vector<double>>("timesteps"));
    ASSERT_EQ(s.sigmas().size(), sigmas.size());
    ASSERT_EQ(s.timesteps().size(), timesteps.size());
    EXPECT_EQ(s.num_inference_steps(), c.get<int>("num_inference_steps"));
    for (size_t i = 0; i < sigmas.size(); ++i) EXPECT_EQ(s.sigmas()[i], sigmas[i]) << "sigma " << i;
    for (size_t i = 0; i < timesteps.size(); ++i)
      EXPECT_EQ(s.timesteps()[i], timesteps[i]) << "timestep " << i;
    ++checked;
  }
  EXPECT_GE(checked, 40);
}

TEST(FlowMatchEulerRefs, KnownFluxDevValues) {
  // FLUX.1-dev at 1024x1024 (4096 tokens), 28 steps: independent check of a few published values.
  FlowMatchEulerDiscreteScheduler s(FlowMatchEulerConfig{.shift = 3.0, .use_dynamic_shifting = true});
  s.set_timesteps(28, flux_sigmas(28), calculate_shift(4096));
  EXPECT_EQ(s.sigmas().front(), 1.0f);
  EXPECT_EQ(s.sigmas()[1], 0.988408625f);
  EXPECT_EQ(s.sigmas()[27], 0.104720898f);
  EXPECT_EQ(s.sigmas()[28], 0.0f);
  EXPECT_EQ(s.timesteps()[0], 1000.0f);
  // schnell: shift 1 and no dynamic shifting leave the linspace as it is.
  FlowMatchEulerDiscreteScheduler schnell;
  schnell.set_timesteps(4, flux_sigmas(4), calculate_shift(4096));
  EXPECT_EQ(schnell.sigmas(), (std::vector<float>{1.0f, 0.75f, 0.5f, 0.25f, 0.0f}));
  EXPECT_EQ(schnell.timesteps(), (std::vector<float>{1000.0f, 750.0f, 500.0f, 250.0f}));
}

TEST(FlowMatchEulerRefs, MuHelpersAndLinspaceMatchPython) {
  const io::JsonConfig shift = refs().object("calculate_shift");
  for (const std::string& key : shift.keys()) {
    EXPECT_EQ(calculate_shift(std::stoll(key)), shift.get<double>(key)) << "image_seq_len " << key;
  }
  EXPECT_EQ(shift.keys().size(), 7u);
  EXPECT_EQ(calculate_shift(3000, 128, 8192, 0.25, 1.5), refs().get<double>("calculate_shift_custom"));
  const io::JsonConfig emp = refs().object("compute_empirical_mu");
  for (const std::string& key : emp.keys()) {
    const auto sep = key.find('_');
    EXPECT_EQ(compute_empirical_mu(std::stoll(key.substr(0, sep)), std::stoi(key.substr(sep + 1))),
              emp.get<double>(key))
        << key;
  }
  EXPECT_EQ(emp.keys().size(), 24u);
  const io::JsonConfig lin = refs().object("flux_sigmas");
  for (const std::string& key : lin.keys()) {
    EXPECT_EQ(flux_sigmas(std::stoi(key)), lin.get<std::vector<double>>(key)) << "n = " << key;
  }
  EXPECT_EQ(linspace(0.0, 1.0, 0).size(), 0u);
  EXPECT_EQ(linspace(2.5, 7.0, 1), std::vector<double>{2.5});
}

TEST(FlowMatchEulerRefs, StepMatchesDiffusersBitForBit) {
  const io::JsonConfig cases = refs().object("step_cases");
  const auto& t = step_refs();
  int checked = 0;
  for (const std::string& key : cases.keys()) {
    SCOPED_TRACE(key);
    const io::JsonConfig c = cases.object(key);
    FlowMatchEulerDiscreteScheduler s = scheduler_for(c.get<std::string>("schedule"));
    const Tensor model_output = t.tensor(key + ".model_output");
    const Tensor sample = t.tensor(key + ".sample");
    const Tensor expected = t.tensor(key + ".expected");
    const Tensor out = s.step(model_output, c.get<int>("index"), sample);
    EXPECT_EQ(out.dtype(), model_output.dtype());
    EXPECT_EQ(out.dtype(), expected.dtype());
    EXPECT_TRUE(testing::all_close(out, expected, 0.0, 0.0));
    // A non-contiguous view of the same values gives the same result.
    const Tensor mo_t = model_output.transpose(1, 2).contiguous().transpose(1, 2);
    EXPECT_TRUE(testing::all_close(s.step(mo_t, c.get<int>("index"), sample), expected, 0.0, 0.0));
    ++checked;
  }
  EXPECT_EQ(checked, 45);
}

TEST(FlowMatchEulerRefs, ScaleNoiseMatchesDiffusersBitForBit) {
  const io::JsonConfig cases = refs().object("scale_noise_cases");
  const auto& t = step_refs();
  int checked = 0;
  for (const std::string& key : cases.keys()) {
    SCOPED_TRACE(key);
    const io::JsonConfig c = cases.object(key);
    FlowMatchEulerDiscreteScheduler s = scheduler_for(c.get<std::string>("schedule"));
    const Tensor sample = t.tensor(key + ".sample");
    const Tensor noise = t.tensor(key + ".noise");
    const Tensor expected = t.tensor(key + ".expected");
    const Tensor out = s.scale_noise(sample, c.get<int>("index"), noise);
    EXPECT_EQ(out.dtype(), expected.dtype());
    EXPECT_TRUE(testing::all_close(out, expected, 0.0, 0.0));
    ++checked;
  }
  EXPECT_EQ(checked, 18);
  const FlowMatchEulerDiscreteScheduler s = scheduler_for("schnell_n4");
  const Tensor x = Tensor::zeros({2, 3}, float32);
  EXPECT_NE(error_of([&] { s.scale_noise(x, 4, x); }).find("expected a step index in [0, 4), got 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { s.scale_noise(x, 0, x.to(bfloat16)); }).find("same shape and dtype"),
            std::string::npos);
}

TEST(FlowMatchEuler, ConfigFromJsonAndFolder) {
  const std::string dir = testing::temp_dir("flow_match_config");
  {
    std::ofstream f(dir + "/scheduler_config.json");
    f << R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.30.0.dev0",
             "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
             "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": true, "shift_terminal": null,
             "time_shift_type": "linear", "invert_sigmas": false})";
  }
  const auto s = FlowMatchEulerDiscreteScheduler::from_pretrained(dir);
  EXPECT_EQ(s.config().shift, 3.0);
  EXPECT_TRUE(s.config().use_dynamic_shifting);
  EXPECT_EQ(s.config().time_shift_type, TimeShiftType::Linear);
  EXPECT_FALSE(s.config().shift_terminal.has_value());
  EXPECT_EQ(s.config().max_image_seq_len, 4096);
  EXPECT_EQ(s.config().base_shift, 0.5);

  const auto defaults = FlowMatchEulerConfig::from_json(io::JsonConfig::parse("{}", "empty"));
  EXPECT_EQ(defaults.num_train_timesteps, 1000);
  EXPECT_EQ(defaults.shift, 1.0);
  EXPECT_FALSE(defaults.use_dynamic_shifting);
  EXPECT_EQ(defaults.time_shift_type, TimeShiftType::Exponential);
  EXPECT_EQ(FlowMatchEulerConfig::from_json(io::JsonConfig::parse(R"({"base_shift": null})", "x")).base_shift,
            std::nullopt);

  {
    std::ofstream f(dir + "/scheduler_config.json");
    f << R"({"_class_name": "EulerDiscreteScheduler"})";
  }
  const std::string wrong_class = error_of([&] { FlowMatchEulerDiscreteScheduler::from_pretrained(dir); });
  EXPECT_NE(wrong_class.find("EulerDiscreteScheduler"), std::string::npos) << wrong_class;
  EXPECT_NE(wrong_class.find("scheduler_config.json"), std::string::npos) << wrong_class;

  const std::string bad_type = error_of([] {
    FlowMatchEulerConfig::from_json(io::JsonConfig::parse(R"({"time_shift_type": "cubic"})", "cfg.json"));
  });
  EXPECT_NE(bad_type.find("time_shift_type"), std::string::npos) << bad_type;
  EXPECT_NE(bad_type.find("cubic"), std::string::npos) << bad_type;
  EXPECT_THROW(FlowMatchEulerConfig::from_json(io::JsonConfig::parse(R"({"shift": "3"})", "cfg.json")),
               Error);
}

TEST(FlowMatchEuler, RejectsUnsupportedOptions) {
  for (const char* key :
       {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling"}) {
    const auto cfg =
        FlowMatchEulerConfig::from_json(io::JsonConfig::parse(std::string("{\"") + key + "\": true}", "c"));
    const std::string msg = error_of([&] { FlowMatchEulerDiscreteScheduler s(cfg); });
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
    EXPECT_NE(msg.find("FlowMatchEulerDiscreteScheduler"), std::string::npos) << msg;
  }
  EXPECT_THROW(FlowMatchEulerDiscreteScheduler(FlowMatchEulerConfig{.num_train_timesteps = 0}), Error);
  EXPECT_THROW(FlowMatchEulerDiscreteScheduler(FlowMatchEulerConfig{.shift = 0.0}), Error);
  EXPECT_THROW(FlowMatchEulerDiscreteScheduler(FlowMatchEulerConfig{.shift_terminal = 1.0}), Error);
}

TEST(FlowMatchEuler, RejectsBadCalls) {
  FlowMatchEulerDiscreteScheduler dev(FlowMatchEulerConfig{.shift = 3.0, .use_dynamic_shifting = true});
  const Tensor x = Tensor::zeros({2, 3}, bfloat16);
  EXPECT_NE(error_of([&] { dev.step(x, 0, x); }).find("set_timesteps"), std::string::npos);
  EXPECT_NE(error_of([&] { dev.set_timesteps(4, flux_sigmas(4)); }).find("mu"), std::string::npos);
  EXPECT_NE(error_of([&] { dev.set_timesteps(4, flux_sigmas(5), 1.0); }).find("expected 4 sigmas"),
            std::string::npos);
  EXPECT_THROW(dev.set_timesteps(0, std::nullopt, 1.0), Error);
  dev.set_timesteps(4, flux_sigmas(4), 1.0);
  EXPECT_NE(error_of([&] { dev.step(x, 4, x); }).find("[0, 4)"), std::string::npos);
  EXPECT_THROW(dev.step(x, -1, x), Error);
  const std::string shape_msg = error_of([&] { dev.step(x, 0, Tensor::zeros({3, 2}, bfloat16)); });
  EXPECT_NE(shape_msg.find("[2, 3]"), std::string::npos) << shape_msg;
  EXPECT_NE(shape_msg.find("[3, 2]"), std::string::npos) << shape_msg;
  const std::string dtype_msg = error_of([&] { dev.step(Tensor::zeros({2, 3}, int64), 0, x); });
  EXPECT_NE(dtype_msg.find("int64"), std::string::npos) << dtype_msg;
  EXPECT_THROW(dev.step(Tensor::zeros({2, 3}, float64), 0, x), Error);
  EXPECT_THROW(calculate_shift(100, 256, 256), Error);
  EXPECT_THROW(flux_sigmas(0), Error);
}

TEST(FlowMatchEuler, StepIsEulerUpdate) {
  // Plain float32 arithmetic check, independent of the reference files: prev = x + (s[i+1] - s[i]) * v.
  FlowMatchEulerDiscreteScheduler s;
  s.set_timesteps(4, flux_sigmas(4), std::nullopt);
  const Tensor v = Tensor::from_vector<float>({1.0f, -2.0f, 4.0f}, {3});
  const Tensor x = Tensor::from_vector<float>({0.5f, 0.5f, 0.5f}, {3});
  EXPECT_EQ(s.step(v, 1, x).to_vector<float>(), (std::vector<float>{0.25f, 1.0f, -0.5f}));
  EXPECT_EQ(s.step(v, 3, x).to_vector<float>(), (std::vector<float>{0.25f, 1.0f, -0.5f}));
}

}  // namespace
}  // namespace kiln
