#include "kiln/tokenizers/chat_prompts.h"

namespace kiln::tokenizers {

const std::string_view kFlux2SystemMessage =
    "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
    "relationships, object\nattribution and actions without speculation.";

std::string remove_image_tokens(std::string_view prompt) {
  constexpr std::string_view kImage = "[IMG]";
  std::string out;
  out.reserve(prompt.size());
  size_t pos = 0;
  for (size_t hit = prompt.find(kImage); hit != std::string_view::npos; hit = prompt.find(kImage, pos)) {
    out.append(prompt.substr(pos, hit - pos));
    pos = hit + kImage.size();
  }
  out.append(prompt.substr(pos));
  return out;
}

std::string mistral_flux2_chat_prompt(std::string_view prompt, std::string_view bos_token,
                                      std::string_view system_message) {
  std::string out(bos_token);
  out += "[SYSTEM_PROMPT]";
  out += system_message;
  out += "[/SYSTEM_PROMPT][INST]";
  out += remove_image_tokens(prompt);
  out += "[/INST]";
  return out;
}

std::string qwen3_chat_prompt(std::string_view prompt, bool enable_thinking) {
  std::string out = "<|im_start|>user\n";
  out += prompt;
  out += "<|im_end|>\n<|im_start|>assistant\n";
  if (!enable_thinking) out += "<think>\n\n</think>\n\n";
  return out;
}

}  // namespace kiln::tokenizers
