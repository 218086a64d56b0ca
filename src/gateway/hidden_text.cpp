#include "gateway/hidden_text.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "text/utf8.h"

namespace lmserve::gateway {

namespace {

// Each byte's value in base64 (both alphabets), -1 outside them.
constexpr std::array<std::int8_t, 256> kValue = [] {
  std::array<std::int8_t, 256> v{};
  v.fill(-1);
  for (int i = 0; i < 26; ++i) {
    v['A' + i] = static_cast<std::int8_t>(i);
    v['a' + i] = static_cast<std::int8_t>(26 + i);
  }
  for (int i = 0; i < 10; ++i) v['0' + i] = static_cast<std::int8_t>(52 + i);
  v['+'] = v['-'] = 62;
  v['/'] = v['_'] = 63;
  return v;
}();

bool in_alphabet(char c) { return kValue[static_cast<unsigned char>(c)] >= 0; }

// Text a person could have meant: valid UTF-8, no control characters but line breaks and tabs,
// and a letter at least (a hash or a key decodes to bytes that fail this).
bool is_text(std::string_view s) {
  if (s.empty() || !text::utf8_is_valid(s)) return false;
  bool letter = false;
  for (const unsigned char c : s) {
    if (c < 0x20 && c != '\n' && c != '\t' && c != '\r') return false;
    if (c == 0x7F) return false;
    letter = letter || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
  }
  return letter;
}

bool names_any(std::string_view folded, std::initializer_list<std::string_view> words) {
  return std::any_of(words.begin(), words.end(), [&](std::string_view w) { return folded.find(w) != std::string_view::npos; });
}

std::string rot13(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>('a' + (c - 'a' + 13) % 26);
    else if (c >= 'A' && c <= 'Z') c = static_cast<char>('A' + (c - 'A' + 13) % 26);
  }
  return out;
}

// The text's characters in reverse order, and each of its words (runs between spaces) reversed
// in place.
std::pair<std::string, std::string> reversed(std::string_view s) {
  std::vector<std::pair<std::size_t, std::size_t>> chars;  // each character's bytes
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const auto len = static_cast<std::size_t>(std::max(1, text::utf8_decode(s, i, &cp)));
    chars.push_back({i, len});
    i += len;
  }
  std::string whole, words;
  whole.reserve(s.size());
  words.reserve(s.size());
  for (auto it = chars.rbegin(); it != chars.rend(); ++it) whole.append(s.substr(it->first, it->second));
  for (std::size_t a = 0; a < chars.size();) {
    std::size_t b = a;
    while (b < chars.size() && s[chars[b].first] != ' ') ++b;
    for (std::size_t k = b; k > a; --k) words.append(s.substr(chars[k - 1].first, chars[k - 1].second));
    if (b < chars.size()) words.push_back(' ');
    a = b + 1;
  }
  return {std::move(whole), std::move(words)};
}

// Each byte's value as a hex digit, -1 for others.
constexpr std::array<std::int8_t, 256> kHex = [] {
  std::array<std::int8_t, 256> v{};
  v.fill(-1);
  for (int i = 0; i < 10; ++i) v['0' + i] = static_cast<std::int8_t>(i);
  for (int i = 0; i < 6; ++i) v['a' + i] = v['A' + i] = static_cast<std::int8_t>(10 + i);
  return v;
}();

int hex_value(char c) { return kHex[static_cast<unsigned char>(c)]; }

bool is_hex(std::string_view s, std::size_t i) { return i < s.size() && hex_value(s[i]) >= 0; }

bool hex_pair_at(std::string_view s, std::size_t i) { return is_hex(s, i) && is_hex(s, i + 1); }

char hex_pair(std::string_view s, std::size_t i) { return static_cast<char>(hex_value(s[i]) * 16 + hex_value(s[i + 1])); }

// A byte written as two hex digits at `k`, alone (no third digit after them) and perhaps behind
// "\x", "0x" or "%": where it ends, or npos.
std::size_t hex_token_at(std::string_view s, std::size_t k, char* byte) {
  std::size_t at = k;
  if (s.substr(at, 2) == "\\x" || s.substr(at, 2) == "0x" || s.substr(at, 2) == "0X") {
    at += 2;
  } else if (at < s.size() && s[at] == '%') {
    at += 1;
  }
  if (!hex_pair_at(s, at) || is_hex(s, at + 2)) return std::string_view::npos;
  *byte = hex_pair(s, at);
  return at + 2;
}

bool is_separator(char c) { return c == ' ' || c == ',' || c == ':' || c == '-'; }

// The bytes of a sequence of hex tokens from `i` on (hex_token_at), side by side or one separator
// apart (a comma, colon or dash perhaps followed by a space: "\x69\x67", "0x69, 0x67", "69 67",
// "%69%67"); `end` is set past the last.
std::string hex_tokens_at(std::string_view s, std::size_t i, std::size_t* end) {
  std::string out;
  *end = i;
  char byte = 0;
  for (std::size_t k = i;;) {
    std::size_t e = hex_token_at(s, k, &byte);
    if (e == std::string_view::npos && k > i && k < s.size() && is_separator(s[k])) {
      const std::size_t after = k + 1 + (s[k] != ' ' && k + 1 < s.size() && s[k + 1] == ' ');  // ", " too
      e = hex_token_at(s, after, &byte);
    }
    if (e == std::string_view::npos) break;
    out.push_back(byte);
    *end = k = e;
  }
  return out;
}

// Whether a run of the base64 alphabet may hold hex (hidden_texts' first pass): 16 characters
// or more (a run of hex, or pairs split by dashes), or a lone pair ("69", "0x69", the "x69" of
// "\\x69"; "%69" leaves "69").
bool hex_pair_run(std::string_view run) {
  const std::size_t n = run.size();
  return n >= 2 && n <= 4 && hex_value(run[n - 1]) >= 0 && hex_value(run[n - 2]) >= 0 &&
         (n == 2 || (n == 3 && run[0] == 'x') || (n == 4 && run[0] == '0' && (run[1] == 'x' || run[1] == 'X')));
}

// How many escapes the text may hold: the '%', '\\' and "&#" it has (unescaped decides).
int escape_marks(std::string_view s) {
  int n = 0;
  for (const char c : {'%', '\\', '&'}) {
    for (auto i = s.find(c); i != std::string_view::npos && n < kMinEscapes; i = s.find(c, i + 1)) n += c != '&' || s.substr(i + 1, 1) == "#";
  }
  return n;
}

// The text with its escapes decoded (%XX, \xXX, \uXXXX with surrogate pairs joined, &#NNN;,
// &#xXX;); `count`: how many.
std::string unescaped(std::string_view s, int* count) {
  std::string out;
  out.reserve(s.size());
  *count = 0;
  auto u16_at = [&](std::size_t i) { return i + 5 < s.size() && s[i] == '\\' && s[i + 1] == 'u' && hex_pair_at(s, i + 2) && hex_pair_at(s, i + 4); };
  auto u16 = [&](std::size_t i) {
    return static_cast<char32_t>(static_cast<unsigned char>(hex_pair(s, i + 2)) * 256 + static_cast<unsigned char>(hex_pair(s, i + 4)));
  };
  for (std::size_t i = 0; i < s.size();) {
    std::size_t next = i;
    if (s[i] == '%' && hex_pair_at(s, i + 1)) {
      out.push_back(hex_pair(s, i + 1));
      next = i + 3;
    } else if (s.substr(i, 2) == "\\x" && hex_pair_at(s, i + 2)) {
      out.push_back(hex_pair(s, i + 2));
      next = i + 4;
    } else if (u16_at(i)) {
      char32_t cp = u16(i);
      next = i + 6;
      if (cp >= 0xD800 && cp < 0xDC00 && u16_at(next) && u16(next) >= 0xDC00 && u16(next) < 0xE000) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (u16(next) - 0xDC00);
        next += 6;
      }
      if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;  // a lone surrogate
      text::utf8_append(out, cp);
    } else if (s.substr(i, 2) == "&#") {
      const bool hex = i + 2 < s.size() && (s[i + 2] == 'x' || s[i + 2] == 'X');
      const std::size_t digits = i + (hex ? 3 : 2);
      std::size_t j = digits;
      char32_t cp = 0;
      while (j < s.size() && j < digits + 7 && (hex ? is_hex(s, j) : s[j] >= '0' && s[j] <= '9')) {
        cp = cp * (hex ? 16 : 10) + static_cast<char32_t>(hex ? hex_value(s[j]) : s[j] - '0');
        ++j;
      }
      if (j > digits && j < s.size() && s[j] == ';' && cp > 0 && cp < 0x110000 && (cp < 0xD800 || cp >= 0xE000)) {
        text::utf8_append(out, cp);
        next = j + 1;
      }
    }
    if (next == i) {
      out.push_back(s[i++]);
    } else {
      ++*count;
      i = next;
    }
  }
  return out;
}

bool is_bit(char c) { return c == '0' || c == '1'; }

// The bytes of 8-bit groups of binary digits from `i` on, side by side or one separator apart
// ("01101001 01100111", "01101001,01100111"); `end` is set past the last group.
std::string binary_groups_at(std::string_view s, std::size_t i, std::size_t* end) {
  std::string out;
  *end = i;
  for (std::size_t k = i;;) {
    const std::size_t at = k + (k > i && k < s.size() && is_separator(s[k]));
    if (at + 8 > s.size() || !std::all_of(s.begin() + static_cast<std::ptrdiff_t>(at), s.begin() + static_cast<std::ptrdiff_t>(at + 8), is_bit)) break;
    int byte = 0;
    for (std::size_t b = at; b < at + 8; ++b) byte = byte * 2 + (s[b] - '0');
    out.push_back(static_cast<char>(byte));
    *end = k = at + 8;
  }
  return out;
}

// Morse code (dots and dashes, letters a space apart, words " / ", " | " or three spaces apart)
// as lower-case text; empty where a letter is not Morse.
std::string morse(std::string_view s) {
  static constexpr std::array<std::pair<std::string_view, char>, 36> kCodes{{
      {".-", 'a'},    {"-...", 'b'},  {"-.-.", 'c'},  {"-..", 'd'},   {".", 'e'},     {"..-.", 'f'},  {"--.", 'g'},   {"....", 'h'},
      {"..", 'i'},    {".---", 'j'},  {"-.-", 'k'},   {".-..", 'l'},  {"--", 'm'},    {"-.", 'n'},    {"---", 'o'},   {".--.", 'p'},
      {"--.-", 'q'},  {".-.", 'r'},   {"...", 's'},   {"-", 't'},     {"..-", 'u'},   {"...-", 'v'},  {".--", 'w'},   {"-..-", 'x'},
      {"-.--", 'y'},  {"--..", 'z'},  {"-----", '0'}, {".----", '1'}, {"..---", '2'}, {"...--", '3'}, {"....-", '4'}, {".....", '5'},
      {"-....", '6'}, {"--...", '7'}, {"---..", '8'}, {"----.", '9'},
  }};
  std::string out;
  std::size_t spaces = 0;
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == ' ') {
      ++spaces;
      ++i;
      continue;
    }
    if (s[i] == '/' || s[i] == '|') {
      spaces = 3;
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < s.size() && (s[j] == '.' || s[j] == '-')) ++j;
    if (j == i) return {};
    const auto code = s.substr(i, j - i);
    const auto it = std::find_if(kCodes.begin(), kCodes.end(), [&](const auto& c) { return c.first == code; });
    if (it == kCodes.end()) return {};
    if (!out.empty() && spaces >= 3) out.push_back(' ');
    out.push_back(it->second);
    spaces = 0;
    i = j;
  }
  return out;
}

// What invisible characters carry: tag characters (U+E0020..U+E007E) as the ASCII they mirror,
// and variation selectors as bytes (U+FE00..U+FE0F: 0..15, U+E0100..U+E01EF: 16..255), each in
// the order met. Empty when the text has none.
std::pair<std::string, std::string> smuggled(std::string_view s) {
  std::string tags, selectors;
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const int len = std::max(1, text::utf8_decode(s, i, &cp));
    if (cp >= 0xE0020 && cp <= 0xE007E) {
      tags.push_back(static_cast<char>(cp - 0xE0000));
    } else if (cp >= 0xFE00 && cp <= 0xFE0F) {
      selectors.push_back(static_cast<char>(cp - 0xFE00));
    } else if (cp >= 0xE0100 && cp <= 0xE01EF) {
      selectors.push_back(static_cast<char>(cp - 0xE0100 + 16));
    }
    i += static_cast<std::size_t>(len);
  }
  return {std::move(tags), std::move(selectors)};
}

}  // namespace

std::string decode_base64(std::string_view run) {
  while (!run.empty() && run.back() == '=') run.remove_suffix(1);
  if (run.size() % 4 == 1) return {};
  std::string out;
  out.reserve(run.size() * 3 / 4);
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : run) {
    const int v = kValue[static_cast<unsigned char>(c)];
    if (v < 0) return {};
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

std::vector<std::string> hidden_texts(std::string_view text, std::string_view folded) {
  std::vector<std::string> out;
  std::size_t budget = kMaxHiddenBytes;
  auto add = [&](std::string s) {
    if (s.size() > budget || std::find(out.begin(), out.end(), s) != out.end()) return;
    budget -= s.size();
    out.push_back(std::move(s));
  };
  bool maybe_hex = false;  // the first pass, over the runs of the base64 alphabet, says where hex may be
  std::size_t hex_pairs = 0, binary_groups = 0;
  for (std::size_t i = 0; i < text.size();) {
    if (!in_alphabet(text[i])) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < text.size() && in_alphabet(text[j])) ++j;
    std::size_t end = j;
    while (end < text.size() && end < j + 2 && text[end] == '=') ++end;
    if (j - i >= kMinBase64Chars) {
      maybe_hex = true;
      if ((j - i) * 3 / 4 <= budget) {
        std::string decoded = decode_base64(text.substr(i, end - i));
        if (is_text(decoded)) add(std::move(decoded));
      }
    } else if (hex_pair_run(text.substr(i, j - i)) && ++hex_pairs >= kMinDecodedBytes) {
      maybe_hex = true;
    }
    if (j - i >= 8 && std::all_of(text.begin() + static_cast<std::ptrdiff_t>(i), text.begin() + static_cast<std::ptrdiff_t>(j), is_bit)) {
      binary_groups += (j - i) / 8;
    }
    i = end;
  }
  // Hex: runs of pairs, and pairs written one by one (a sequence starts at a run of two digits,
  // at "0x", "\\x" or "%"); a run is passed over whole. Looked for only where the first pass found
  // a long run or enough lone pairs.
  for (std::size_t i = 0; maybe_hex && i < text.size();) {
    std::size_t next = i + 1, run = i;
    while (is_hex(text, run)) ++run;
    if (run - i >= 2 * kMinDecodedBytes && (run - i) % 2 == 0 && (run - i) / 2 <= budget) {
      std::string bytes;
      for (std::size_t k = i; k < run; k += 2) bytes.push_back(hex_pair(text, k));
      if (is_text(bytes)) add(std::move(bytes));
    }
    next = std::max(next, run);
    const bool starts = run - i == 2 || (run - i == 1 && text[i] == '0' && run < text.size() && (text[run] == 'x' || text[run] == 'X')) ||
                        (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'x') || (text[i] == '%' && hex_pair_at(text, i + 1));
    if (starts) {
      std::size_t end = i;
      std::string bytes = hex_tokens_at(text, i, &end);
      if (bytes.size() >= kMinDecodedBytes && is_text(bytes)) add(std::move(bytes));
      next = std::max(next, end);
    }
    i = next;
  }
  for (std::size_t i = 0; binary_groups >= kMinDecodedBytes && i < text.size();) {  // binary, 8 digits a byte
    std::size_t end = i;
    if (is_bit(text[i]) && (i == 0 || !is_bit(text[i - 1]))) {
      std::string bytes = binary_groups_at(text, i, &end);
      if (bytes.size() >= kMinDecodedBytes && bytes.size() <= budget && is_text(bytes)) add(std::move(bytes));
    }
    i = std::max(i + 1, end);
  }
  if (text.find(".-") != std::string_view::npos || text.find("-.") != std::string_view::npos) {
    // Morse: each stretch of dots, dashes, spaces and word marks (/, |) of 16 characters or more
    auto is_morse = [](char c) { return c == '.' || c == '-' || c == ' ' || c == '/' || c == '|'; };
    for (std::size_t i = 0; i < text.size();) {
      std::size_t e = i;
      while (e < text.size() && is_morse(text[e])) ++e;
      if (e - i >= 2 * kMinDecodedBytes) {
        std::string m = morse(text.substr(i, e - i));
        if (static_cast<std::size_t>(std::count_if(m.begin(), m.end(), [](char c) { return c != ' '; })) >= kMinDecodedBytes) add(std::move(m));
      }
      i = e + 1;
    }
  }
  if (escape_marks(text) >= kMinEscapes) {
    int escapes = 0;
    if (std::string u = unescaped(text, &escapes); escapes >= kMinEscapes && is_text(u)) add(std::move(u));
  }
  // Plane 14 (tags, most selectors: F3 A0..A4 in UTF-8) or U+FE00..FE0F (EF B8 80..8F).
  if (text.find('\xF3') != std::string_view::npos || text.find("\xEF\xB8") != std::string_view::npos) {
    auto [tags, selectors] = smuggled(text);
    if (tags.size() >= kMinDecodedBytes && is_text(tags)) add(std::move(tags));
    if (selectors.size() >= kMinDecodedBytes && is_text(selectors)) add(std::move(selectors));
  }
  if (names_any(folded, {"rot13", "rot-13", "rot 13", "caesar", "凯撒"})) add(rot13(text));
  if (names_any(folded, {"backward", "reverse", "倒过来", "反过来", "倒着", "倒序", "反着"})) {
    auto [whole, words] = reversed(text);
    add(std::move(whole));
    add(std::move(words));
  }
  return out;
}

}  // namespace lmserve::gateway
