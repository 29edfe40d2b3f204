// The denoising loop (pipelines/denoise.h) against the Scheduler interface a new sampler implements: the
// denoiser gets the scheduler's scale_model_input of the latents, a stateful sampler keeps its history in the
// call's own copy (clone), an ancestral one draws its noise from the call's generators, and a text-to-image
// start is scaled by init_noise_sigma (pipelines/task_stages.h).
#include <gtest/gtest.h>

#include <vector>

#include "kiln/models/autoencoder_kl.h"
#include "kiln/ops.h"
#include "kiln/pipelines/generator.h"
#include "pipelines/call_generators.h"
#include "pipelines/denoise.h"
#include "pipelines/task_stages.h"
#include "support/test_data.h"

namespace kiln {
namespace {

// A sampler with what flow matching does not use: its model input is the sample times (step + 2), its
// starting noise is scaled by 3, and each step adds the previous step's output (a multistep history) and
// noise it draws (an ancestral sampler's).
class HistorySampler : public Scheduler {
 public:
  std::unique_ptr<Scheduler> clone() const override { return std::make_unique<HistorySampler>(*this); }
  const std::vector<float>& timesteps() const override { return timesteps_; }
  double init_noise_sigma() const override { return 3.0; }
  Tensor scale_model_input(const Tensor& sample, int step_index) const override {
    return mul(sample, static_cast<double>(step_index + 2));
  }
  Tensor step(const Tensor& model_output, int, const Tensor& sample, const NoiseDraw& noise) override {
    Tensor out = add(sample, model_output);
    if (previous_.defined()) out = add(out, previous_);
    previous_ = model_output;
    return add(out, noise(sample.shape(), sample.dtype()));
  }
  Tensor scale_noise(const Tensor& sample, int, const Tensor&) const override { return sample; }
  const Tensor& previous() const { return previous_; }

 private:
  std::vector<float> timesteps_ = {900, 500, 100};
  Tensor previous_;
};

TEST(DenoiseLoop, TheSchedulersInputStateAndNoiseReachTheLoop) {
  HistorySampler configured;
  const std::unique_ptr<Scheduler> call = configured.clone();
  std::vector<Tensor> inputs;
  Generator generator(7);
  int draws = 0;
  const Tensor start = Tensor::full({2, 3}, 1.0, float32);
  const Tensor end = pipelines::denoise(start, {.scheduler = call.get(),
                                                .model_output =
                                                    [&](const Tensor& x, int, float) {
                                                      inputs.push_back(x);
                                                      return Tensor::full({2, 3}, 0.5, float32);
                                                    },
                                                .noise =
                                                    [&](const Shape& shape, DType dtype) {
                                                      ++draws;
                                                      return randn_tensor(shape, generator, dtype);
                                                    }});
  ASSERT_EQ(inputs.size(), 3u);
  // Step 0's input is the start times 2: scale_model_input was applied.
  EXPECT_EQ(inputs[0].to_vector<float>(), std::vector<float>(6, 2.0f));
  EXPECT_EQ(draws, 3);
  // Replayed by hand: each step adds the output, the previous output (from the second step on) and a draw.
  Generator replay(7);
  Tensor expected = start;
  for (int i = 0; i < 3; ++i) {
    expected = add(expected, Tensor::full({2, 3}, i == 0 ? 0.5 : 1.0, float32));
    expected = add(expected, randn_tensor({2, 3}, replay, float32));
  }
  EXPECT_EQ(end.to_vector<float>(), expected.to_vector<float>());
  // The history was the call's copy's: the configured scheduler saw none of it.
  EXPECT_FALSE(configured.previous().defined());
  EXPECT_TRUE(static_cast<const HistorySampler&>(*call).previous().defined());
}

TEST(DenoiseLoop, ATextToImageStartIsScaledByInitNoiseSigma) {
  const models::AutoencoderKL codec(
      models::AutoencoderKLConfig::from_file(testing::data_path("models/flux-tiny-dev/vae/config.json")));
  PipelineRequest request;
  request.generator = Generator(3);
  pipelines::CallGenerators generators(request);
  const pipelines::ResolvedRequest call{.height = 32, .width = 32, .num_inference_steps = 3};
  const HistorySampler sampler;
  const pipelines::TaskStart start = pipelines::start_latents({.task = Task::TextToImage,
                                                               .request = request,
                                                               .call = call,
                                                               .batch = 1,
                                                               .dtype = float32,
                                                               .generators = generators,
                                                               .schedule = sampler,
                                                               .codec = codec});
  Generator replay(3);
  const Tensor noise = randn_tensor(codec.latent_shape(1, 32, 32), replay, float32);
  EXPECT_EQ(start.latents.to_vector<float>(), mul(noise, 3.0).to_vector<float>());
}

}  // namespace
}  // namespace kiln
