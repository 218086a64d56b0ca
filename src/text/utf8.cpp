#include "text/utf8.h"

namespace lmserve::text {
namespace {

// How many bytes a sequence starting with `lead` has, and the valid range of its second byte
// (Unicode Table 3-7: well-formed UTF-8 byte sequences). 0 for bytes that cannot start one.
struct LeadInfo {
  int length;
  unsigned char second_lo, second_hi;
};

LeadInfo lead_info(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Length of the valid prefix of a sequence at `pos` (1..length-1 when truncated or broken),
// and whether it is complete.
int valid_prefix(std::string_view s, std::size_t pos, bool* complete) {
  auto b0 = static_cast<unsigned char>(s[pos]);
  LeadInfo li = lead_info(b0);
  *complete = false;
  if (li.length == 0) return 0;
  if (li.length == 1) {
    *complete = true;
    return 1;
  }
  int n = 1;
  for (; n < li.length && pos + n < s.size(); ++n) {
    auto b = static_cast<unsigned char>(s[pos + n]);
    bool ok = n == 1 ? (b >= li.second_lo && b <= li.second_hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return n;
  }
  *complete = n == li.length;
  return n;
}

}  // namespace

int utf8_decode(std::string_view s, std::size_t pos, char32_t* cp) {
  bool complete = false;
  int n = valid_prefix(s, pos, &complete);
  if (!complete) return 0;
  auto b0 = static_cast<unsigned char>(s[pos]);
  char32_t c = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int i = 1; i < n; ++i) c = (c << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  *cp = c;
  return n;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool utf8_is_valid(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp;
    int n = utf8_decode(s, i, &cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    bool complete = false;
    int n = valid_prefix(s, i, &complete);
    if (complete) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += kReplacementUtf8;  // one U+FFFD per maximal invalid subpart
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

std::size_t utf8_complete_prefix(std::string_view s) {
  // Only the last 3 bytes can belong to an unfinished sequence.
  std::size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (std::size_t i = start; i < s.size(); ++i) {
    auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80 || b >= 0xC0) {  // a lead byte (or ASCII)
      bool complete = false;
      int n = valid_prefix(s, i, &complete);
      if (!complete && n > 0 && i + n == s.size()) return i;  // valid so far, just cut short
    }
  }
  return s.size();
}

std::size_t utf8_length(std::string_view s) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < s.size(); ++count) {
    char32_t cp;
    int n = utf8_decode(s, i, &cp);
    i += n == 0 ? 1 : n;
  }
  return count;
}

}  // namespace lmserve::text
