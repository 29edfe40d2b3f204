// The chat prompts FLUX.2's pipelines tokenize, rendered by code: the strings apply_chat_template gives for
// the messages diffusers builds, with the two real templates (no Jinja engine is needed for these two
// shapes).
//  - Flux2Pipeline (Mistral Small 3.x, PixtralProcessor): format_input makes [system: [text SYSTEM_MESSAGE],
//    user: [text prompt]] with every "[IMG]" removed from the prompt; Mistral-Small-3.1's template renders
//    bos_token + "[SYSTEM_PROMPT]" + system + "[/SYSTEM_PROMPT]" + "[INST]" + prompt + "[/INST]"
//    (add_generation_prompt=False adds nothing).
//  - Flux2KleinPipeline (Qwen3): [user: prompt] with add_generation_prompt=True and enable_thinking=False
//  renders
//    "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n".
//    ZImagePipeline asks enable_thinking=True, which leaves the empty think block out.
#pragma once

#include <string>
#include <string_view>

namespace kiln::tokenizers {

// diffusers' SYSTEM_MESSAGE (from black-forest-labs/flux2), with its newline after "object".
extern const std::string_view kFlux2SystemMessage;

// Removes every "[IMG]" (one left-to-right pass, as Python's str.replace).
std::string remove_image_tokens(std::string_view prompt);

std::string mistral_flux2_chat_prompt(std::string_view prompt, std::string_view bos_token,
                                      std::string_view system_message = kFlux2SystemMessage);

std::string qwen3_chat_prompt(std::string_view prompt, bool enable_thinking = false);

}  // namespace kiln::tokenizers
