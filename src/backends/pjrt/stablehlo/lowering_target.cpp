#include "backends/pjrt/stablehlo/lowering_target.h"

#include <charconv>
#include <cstdlib>
#include <string>

#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {

namespace {
// Keys per block on a TPU, from libtpu's plans for a v5e (docs/devices.md): FLUX's attention at 1024x1024
// (24 heads, 4608 tokens) needs 1944 MiB of scratch composed whole, 216 MiB over blocks of 512 keys and
// 54 MiB over blocks of 256; a multiple of the MXU's 128.
constexpr int64_t kTpuAttentionKeyBlock = 256;
}  // namespace

LoweringTarget lowering_target(std::string_view platform) {
  LoweringTarget t;
  t.platform = std::string(platform);
  if (platform == "cuda") {
    const char* env = std::getenv("KILN_PJRT_FUSED_ATTENTION");
    const std::string value = env != nullptr ? env : "";
    KILN_CHECK(value.empty() || value == "0" || value == "1",
               "KILN_PJRT_FUSED_ATTENTION must be 0 (attention as plain ops) or 1 (the default: cuDNN fused "
               "attention on cuda), got '"
                   << value << "'");
    t.cudnn_attention = value != "0";
  }
  if (platform == "tpu") t.attention_key_block = kTpuAttentionKeyBlock;
  if (const char* env = std::getenv("KILN_PJRT_ATTENTION_KEY_BLOCK"); env != nullptr && *env != '\0') {
    int64_t block = -1;
    const std::string_view text(env);
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), block);
    KILN_CHECK(error == std::errc() && end == text.data() + text.size() && block >= 0 && block <= (1 << 20),
               "KILN_PJRT_ATTENTION_KEY_BLOCK must be a number of keys from 0 (attention composed whole) to "
               "1048576, got '"
                   << text << "'");
    t.attention_key_block = block;
  }
  return t;
}

int64_t attention_key_block(std::string_view platform, DType dtype, int64_t head_dim) {
  const LoweringTarget t = lowering_target(platform);
  if (t.cudnn_attention && cudnn_attention_takes(dtype, head_dim)) return 0;
  return t.attention_key_block;
}

}  // namespace kiln::pjrt::hlo
