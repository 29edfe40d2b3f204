// `kiln serve --api-key KEY`: requests carry `Authorization: Bearer KEY` (as OpenAI's clients send their
// key).
#pragma once

#include <string>
#include <string_view>

namespace kiln::serve {

// Whether the Authorization header's value is "Bearer <expected>". The key is compared in time that depends
// only on the expected key's length, never on how many leading bytes of a guess are right.
bool bearer_matches(std::string_view authorization, std::string_view expected);

// Whether `host` is a loopback address (127.0.0.0/8, ::1, localhost): what `kiln serve` accepts without a
// key.
bool is_loopback_host(const std::string& host);

}  // namespace kiln::serve
