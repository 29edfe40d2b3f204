// GPT-2's byte-level alphabet (bytes_to_unicode): every byte maps to a printable character so that byte-level
// BPE vocabularies can be stored as text. Bytes 33-126, 161-172 and 174-255 map to themselves, the other 68
// to U+0100, U+0101, ... in increasing byte order.
#pragma once

#include <string>
#include <string_view>

namespace kiln::tokenizers {

// UTF-8 text of the mapped characters of text's bytes.
std::string byte_level_encode(std::string_view text);

}  // namespace kiln::tokenizers
