#include "text/byte_level.h"

#include "text/utf8.h"

namespace lmserve::text {
namespace {

struct Tables {
  std::array<std::string, 256> to_char;
  std::array<int, 512> to_byte;  // code point (< 512) -> byte, -1 if none
};

const Tables& tables() {
  static const Tables t = [] {
    Tables r;
    r.to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      utf8_append(r.to_char[b], cp);
      r.to_byte[cp] = b;
    }
    return r;
  }();
  return t;
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() { return tables().to_char; }

std::string bytes_to_byte_level(std::string_view bytes) {
  const auto& t = tables().to_char;
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t[b];
  return out;
}

bool byte_level_to_bytes(std::string_view token, std::string* out) {
  const auto& t = tables().to_byte;
  std::string bytes;
  bytes.reserve(token.size());
  for (std::size_t i = 0; i < token.size();) {
    char32_t cp;
    int n = utf8_decode(token, i, &cp);
    if (n == 0 || cp >= t.size() || t[cp] < 0) return false;
    bytes += static_cast<char>(t[cp]);
    i += n;
  }
  *out += bytes;
  return true;
}

}  // namespace lmserve::text
