// Base64 (RFC 4648, with padding): the b64_json images of OpenAI's images API, and the images a JSON request
// carries (Kiln's image fields, AUTOMATIC1111's init_images).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kiln::serve {

std::string base64_encode(std::string_view bytes);
// The bytes `text` encodes: the standard alphabet, padded to a multiple of four characters or not; nullopt
// for any other character (whitespace included) or a length no encoding has.
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace kiln::serve
