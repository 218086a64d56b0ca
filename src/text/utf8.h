// UTF-8 helpers shared by the tokenizer, the detokenizer and the template engine.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lmserve::text {

inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// Decodes the code point starting at s[pos]. Returns its length in bytes (1..4), or 0 if the
// bytes there are not a complete, valid UTF-8 sequence (overlong, surrogate, > U+10FFFF,
// truncated, or a stray continuation byte).
int utf8_decode(std::string_view s, std::size_t pos, char32_t* cp);

// Appends the UTF-8 encoding of `cp` (which must be a valid scalar value).
void utf8_append(std::string& out, char32_t cp);

bool utf8_is_valid(std::string_view s);

// Replaces every maximal invalid subsequence with U+FFFD, as Rust's String::from_utf8_lossy
// (and so Hugging Face tokenizers) does.
std::string utf8_lossy(std::string_view bytes);

// Length of the longest prefix of `s` that does not end inside an incomplete (but so far
// valid) UTF-8 sequence: bytes after it may still become a character when more arrive.
std::size_t utf8_complete_prefix(std::string_view s);

// Number of code points (invalid bytes count one each).
std::size_t utf8_length(std::string_view s);

}  // namespace lmserve::text
