// server/http: the fields of an HTTP/1.x head read by a plain pass, for the parsers that read a
// plain head themselves and leave everything else to Beast (request_parser.h: a client's
// request; gateway/upstream_parser.h: a replica's answer).
//
// "Plain" is a strict part of what Beast takes: each field `name ":" OWS value OWS CRLF` with a
// token for a name and printable ASCII, SP and HTAB for a value (no obs-text, no control byte),
// no line folded into the one before, and the empty line that ends the head. A reader finding
// anything else returns nullptr and the caller gives the bytes to Beast as they are, so the two
// readings can only differ where the caller's own checks do (tests compare them).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace lmserve::server::http {

// RFC 9110's tchar: a method's and a field name's characters, as Beast reads them.
extern const std::array<bool, 256> kTokenChar;

// The first byte from `p` that is not printable ASCII (0x21-0x7e), or with `value` not a field
// value's (also SP and HTAB); `end` where there is none.
const char* skip_text(const char* p, const char* end, bool value);

// Whether `s` is `lower` (lower-case letters and '-') in any case. For a name or a field value
// as read here: a byte that is neither (a CR, which a value never holds) could pass for '-'.
inline bool names(std::string_view s, std::string_view lower) {
  if (s.size() != lower.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((s[i] | 0x20) != lower[i]) return false;
  }
  return true;
}

// A field as a plain pass keeps it until the head has proved plain (trivial: a list of them is left
// uninitialised, only the first n read).
struct PlainField {
  const char *name, *value;
  std::size_t name_size, value_size;
  std::string_view name_v() const { return {name, name_size}; }
  std::string_view value_v() const { return {value, value_size}; }
};

// A Content-Length value as the plain passes take it: 1 to 15 digits (Beast takes more: a list of
// equal values, which the passes leave to it). False for anything else.
inline bool read_plain_length(std::string_view value, std::uint64_t& length) {
  if (value.empty() || value.size() > 15) return false;
  std::uint64_t v = 0;
  for (const char c : value) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  length = v;
  return true;
}

// Reads the fields from `p` to the empty line, calling `on_field(name, value)` for each (the value
// without its surrounding whitespace), which returns false to give up. Returns the byte after the
// empty line, or nullptr where the head is not plain, not all in [p, end), or given up.
template <class OnField>
const char* read_plain_fields(const char* p, const char* end, OnField&& on_field) {
  for (;;) {
    if (end - p < 2) return nullptr;
    if (p[0] == '\r') return p[1] == '\n' ? p + 2 : nullptr;
    const char* const name = p;
    while (p < end && kTokenChar[static_cast<unsigned char>(*p)]) ++p;
    if (p == name || p == end || *p != ':') return nullptr;
    const std::string_view name_v(name, static_cast<std::size_t>(p - name));
    ++p;
    while (p < end && (*p == ' ' || *p == '\t')) ++p;
    const char* const value = p;
    p = skip_text(p, end, true);
    const char* value_end = p;
    while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t')) --value_end;
    // CRLF, and no folded line after it (Beast joins those).
    if (end - p < 3 || p[0] != '\r' || p[1] != '\n' || p[2] == ' ' || p[2] == '\t') return nullptr;
    p += 2;
    if (!on_field(name_v, std::string_view(value, static_cast<std::size_t>(value_end - value)))) return nullptr;
  }
}

}  // namespace lmserve::server::http
