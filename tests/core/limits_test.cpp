// Named limits (kiln/core/limits.h) and the config readers that apply them: an absurd size is refused with
// the key, the value and the limit, before anything of that size exists.
#include "kiln/core/limits.h"

#include <gtest/gtest.h>

#include "io/io_test_util.h"

namespace kiln {
namespace {

TEST(Limits, RangeNamesTheValueAndTheLimit) {
  EXPECT_KILN_ERROR(limits::check_range("--height", 1000000, 1, limits::kMaxImageSide),
                    "--height 1000000 exceeds the maximum 16384");
  EXPECT_KILN_ERROR(limits::check_range("--steps", 0, 1, limits::kMaxInferenceSteps),
                    "--steps 0 is below the minimum 1");
  EXPECT_NO_THROW(limits::check_range("--steps", 1000, 1, limits::kMaxInferenceSteps));
}

TEST(Limits, PromptSizeInBytes) {
  EXPECT_KILN_ERROR(limits::check_prompt_size("--prompt", std::string(10 << 20, 'a')),
                    "--prompt is 10485760 bytes, more than the maximum 65536");
  EXPECT_NO_THROW(limits::check_prompt_size("--prompt", std::string(limits::kMaxPromptBytes, 'a')));
}

TEST(Limits, ConfigBoundsNameTheFileAndKey) {
  EXPECT_KILN_ERROR(
      limits::check_config("t/config.json", {{"num_layers", int64_t{1} << 40, limits::kMaxLayers}}),
      "t/config.json: num_layers 1099511627776 exceeds the maximum 1024");
  EXPECT_KILN_ERROR(limits::check_config("c.json", {{"hidden_size", 0, limits::kMaxWidth, 1}}),
                    "c.json: hidden_size 0 is below the minimum 1");
}

}  // namespace
}  // namespace kiln
