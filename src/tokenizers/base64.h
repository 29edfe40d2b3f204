// Standard base64 (RFC 4648, with padding), as tokenizer.json stores binary blobs such as
// precompiled_charsmap.
#pragma once

#include <string>
#include <string_view>

namespace kiln::tokenizers {

// Throws kiln::Error naming `source` on characters outside the alphabet or a bad length.
std::string base64_decode(std::string_view text, const std::string& source);

}  // namespace kiln::tokenizers
