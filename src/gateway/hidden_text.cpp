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
    if (s.size() > budget) return;
    budget -= s.size();
    out.push_back(std::move(s));
  };
  for (std::size_t i = 0; i < text.size();) {
    if (!in_alphabet(text[i])) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < text.size() && in_alphabet(text[j])) ++j;
    std::size_t end = j;
    while (end < text.size() && end < j + 2 && text[end] == '=') ++end;
    if (j - i >= kMinBase64Chars && (j - i) * 3 / 4 <= budget) {
      std::string decoded = decode_base64(text.substr(i, end - i));
      if (is_text(decoded)) add(std::move(decoded));
    }
    i = end;
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
