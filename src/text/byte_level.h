// GPT-2's reversible byte <-> printable-character map used by byte-level BPE: printable
// Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in order.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace lmserve::text {

// The UTF-8 encoding of the character that stands for each byte.
const std::array<std::string, 256>& byte_to_unicode();

// Maps every byte of `bytes` to its character.
std::string bytes_to_byte_level(std::string_view bytes);

// Inverse of bytes_to_byte_level for a whole token: false (and `out` untouched) if any
// character of `token` is not in the map.
bool byte_level_to_bytes(std::string_view token, std::string* out);

}  // namespace lmserve::text
