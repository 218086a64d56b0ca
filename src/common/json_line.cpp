#include "common/json_line.h"

#include <charconv>
#include <cstring>
#include <cmath>

namespace lmserve {

namespace {

// The length of the UTF-8 sequence at s[i], or 0 when the bytes there are not one (overlong
// forms, surrogates and code points past U+10FFFF are not).
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  const auto cont = [&](std::size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // a surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

// Whether any of the 8 bytes in `x` must be escaped or checked: a control character, '"', '\\' or
// a byte of a multi-byte sequence. (Each test is exact about whether some byte matches; which one
// is left to the byte-by-byte loop.)
bool any_special(std::uint64_t x) {
  constexpr std::uint64_t kOnes = 0x0101010101010101ULL, kHigh = 0x8080808080808080ULL;
  const auto has_zero = [](std::uint64_t y) { return (y - kOnes) & ~y & kHigh; };
  const std::uint64_t below_space = (x - kOnes * 0x20) & ~x & kHigh;
  return ((x & kHigh) | below_space | has_zero(x ^ (kOnes * '"')) | has_zero(x ^ (kOnes * '\\'))) != 0;
}

// The length of the run at the start of `v` of bytes that go as they are: eight at a time, then
// one by one.
std::size_t plain_run(std::string_view v) {
  std::size_t j = 0;
  for (std::uint64_t x; j + 8 <= v.size(); j += 8) {
    std::memcpy(&x, v.data() + j, 8);
    if (any_special(x)) break;
  }
  while (j < v.size()) {
    const auto c = static_cast<unsigned char>(v[j]);
    if (c < 0x20 || c == '"' || c == '\\' || c >= 0x80) break;
    ++j;
  }
  return j;
}

}  // namespace

void append_json_escaped(std::string& out, std::string_view v) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::size_t i = 0;
  while (i < v.size()) {
    const std::size_t j = i + plain_run(v.substr(i));
    out.append(v.data() + i, j - i);
    if (j == v.size()) return;
    i = j;
    const auto c = static_cast<unsigned char>(v[i]);
    if (c >= 0x80) {
      const std::size_t n = utf8_length(v, i);
      if (n == 0) {
        out += "\xEF\xBF\xBD";  // U+FFFD for the byte that does not begin a sequence
        ++i;
      } else {
        out.append(v.data() + i, n);
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 0xF];
    }
    ++i;
  }
}

// `,"key":`, for the fields field() does not write whole (long or escaped values).
void JsonLine::key(std::string_view k) {
  if (text_.size() > 1) text_ += ',';
  text_ += '"';
  text_.append(k);
  text_ += "\":";
}

// `,"key":value` (the value quoted when `quoted`) appended with one call: most fields are short.
void JsonLine::field(std::string_view k, std::string_view v, bool quoted) {
  char buf[192];
  if (k.size() + v.size() + 6 > sizeof buf) {
    key(k);
    if (quoted) text_ += '"';
    text_.append(v);
    if (quoted) text_ += '"';
    return;
  }
  char* p = buf;
  if (text_.size() > 1) *p++ = ',';
  *p++ = '"';
  std::memcpy(p, k.data(), k.size());
  p += k.size();
  *p++ = '"';
  *p++ = ':';
  if (quoted) *p++ = '"';
  std::memcpy(p, v.data(), v.size());
  p += v.size();
  if (quoted) *p++ = '"';
  text_.append(buf, static_cast<std::size_t>(p - buf));
}

JsonLine& JsonLine::str(std::string_view k, std::string_view value) {
  if (plain_run(value) == value.size()) {  // most values (names, digests, times): as they are
    field(k, value, true);
    return *this;
  }
  key(k);
  text_ += '"';
  append_json_escaped(text_, value);
  text_ += '"';
  return *this;
}

JsonLine& JsonLine::num(std::string_view k, std::int64_t value) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, value);
  field(k, std::string_view(buf, static_cast<std::size_t>(r.ptr - buf)), false);
  return *this;
}

JsonLine& JsonLine::real(std::string_view k, double value) {
  if (!std::isfinite(value)) return null(k);
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, value);
  field(k, std::string_view(buf, static_cast<std::size_t>(r.ptr - buf)), false);
  return *this;
}

JsonLine& JsonLine::millis(std::string_view k, double seconds) {
  if (!std::isfinite(seconds)) return null(k);
  const double us = std::round(seconds * 1e6);
  if (std::fabs(us) > 9e15) return real(k, seconds * 1e3);  // past the integers a double holds exactly
  auto v = static_cast<std::int64_t>(us);
  char buf[32];
  char* p = buf;
  if (v < 0) {
    *p++ = '-';
    v = -v;
  }
  p = std::to_chars(p, buf + sizeof buf, v / 1000).ptr;
  if (int frac = static_cast<int>(v % 1000); frac != 0) {
    *p++ = '.';
    for (int d = 100; frac != 0; d /= 10) {  // the digits up to the last that is not zero
      *p++ = static_cast<char>('0' + frac / d);
      frac %= d;
    }
  }
  field(k, std::string_view(buf, static_cast<std::size_t>(p - buf)), false);
  return *this;
}

JsonLine& JsonLine::boolean(std::string_view k, bool value) {
  field(k, value ? "true" : "false", false);
  return *this;
}

JsonLine& JsonLine::null(std::string_view k) {
  field(k, "null", false);
  return *this;
}

std::string JsonLine::done() && {
  text_ += '}';
  return std::move(text_);
}

}  // namespace lmserve
