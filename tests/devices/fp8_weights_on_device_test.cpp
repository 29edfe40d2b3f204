// A FLUX transformer loaded from an fp8 single file (tools/gguf_refs/fp8_single_file.py) keeps its Linear
// weights in fp8 on the cpu; moved to a PJRT device, which has no fp8 product, they are widened to the
// compute dtype (their exact values) and the forward there gives diffusers' output. GGUF blocks are refused
// instead (pipelines_on_device_test.cpp).
#include <gtest/gtest.h>

#include "kiln/io/safetensors.h"
#include "kiln/models/flux_transformer.h"
#include "support/pjrt_devices.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const Device xla0 = testing::test_device(0);

int64_t uint8_parameters(models::FluxTransformer2DModel& m) {
  int64_t n = 0;
  for (const auto& [name, t] : m.named_parameters()) n += t->defined() && t->dtype() == uint8;
  return n;
}

TEST(Fp8WeightsOnDevice, MovedToADeviceTheyAreWidenedAndGiveDiffusersOutput) {
  KILN_SKIP_WITHOUT_PJRT();
  auto model = models::FluxTransformer2DModel::from_single_file(
      testing::data_path("gguf/flux-tiny-dev-bfl-fp8.safetensors"),
      {.config = testing::data_path("models/flux-tiny-dev-bf16/transformer"), .dtype = bfloat16});
  EXPECT_GT(uint8_parameters(*model), 0);
  model->to(xla0);
  EXPECT_EQ(uint8_parameters(*model), 0);
  for (const auto& [name, t] : model->named_parameters()) {
    if (t->defined()) {
      EXPECT_EQ(t->device(), xla0) << name;
    }
  }

  const io::SafetensorsFile in(testing::data_path("gguf/single_file_goldens.safetensors"));
  auto on = [&](const char* name) { return in.tensor(std::string("tiny_") + name).to(xla0); };
  const Tensor out = model->forward(on("hidden"), on("encoder_hidden"), on("pooled"), on("timestep"),
                                    on("guidance"), on("txt_ids"), on("img_ids"));
  const io::SafetensorsFile goldens(testing::data_path("gguf/fp8_single_file_goldens.safetensors"));
  EXPECT_TRUE(testing::rel_max_error_within(out.to(cpu), goldens.tensor("fp8_out"), 1e-2));

  // Back on the cpu the weights stay widened: the same forward, no fp8 left to read.
  model->to(cpu);
  EXPECT_EQ(uint8_parameters(*model), 0);
}

}  // namespace
}  // namespace kiln
