// Base64 (RFC 4648, with padding): the b64_json images of OpenAI's images API.
#pragma once

#include <string>
#include <string_view>

namespace kiln::serve {

std::string base64_encode(std::string_view bytes);

}  // namespace kiln::serve
