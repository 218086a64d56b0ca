// gateway/route_fields: scan_route_fields, the routing pass over a body without a JSON library.
// Each rule below is nlohmann's (3.11, the lexer and the parser of json::sax_parse), so that the
// gateway and the replica behind it never read one body two ways.
#include "gateway/route_fields.h"

#include <array>
#include <charconv>
#include <utility>

#include "text/utf8.h"

namespace lmserve::gateway {
namespace {

enum class Member { kOther, kModel, kUser };  // which top-level member a value is

bool is_digit(char c) { return c >= '0' && c <= '9'; }
unsigned byte(char c) { return static_cast<unsigned char>(c); }

// The bytes a string holds as they are: printable ASCII but the quote and the backslash.
constexpr std::array<bool, 256> kPlain = [] {
  std::array<bool, 256> plain{};
  for (int c = 0x20; c < 0x80; ++c) plain[c] = c != '"' && c != '\\';
  return plain;
}();

class Scan {
 public:
  Scan(std::string_view text, RouteFieldValues& out) : at_(text.data()), end_(text.data() + text.size()), out_(out) {}

  bool document() {
    if (at_ != end_ && byte(*at_) == 0xEF) {  // a byte order mark, whole or refused
      if (end_ - at_ < 3 || byte(at_[1]) != 0xBB || byte(at_[2]) != 0xBF) return false;
      at_ += 3;
    }
    if (!value(0, Member::kOther)) return false;
    skip_space();
    return at_ == end_ || *at_ == '\0';
  }

 private:
  bool refuse(const char* why) {
    out_.refusal = why;
    return false;
  }
  bool more() const { return at_ != end_; }
  void skip_space() {
    while (more() && (*at_ == ' ' || *at_ == '\n' || *at_ == '\r' || *at_ == '\t')) ++at_;
  }

  // A value inside `depth` open arrays and objects. A value in the place of "model" that is not
  // a string is refused as soon as it is known to be a value (an opening bracket; a whole
  // literal or number), as RouteFields' events refuse it.
  bool value(int depth, Member member) {
    skip_space();
    if (!more()) return false;
    switch (*at_) {
      case '{':
      case '[': {
        if (member == Member::kModel) return refuse(RouteFieldValues::kModelNotString);
        if (depth + 1 > kMaxJsonDepth) return refuse(RouteFieldValues::kTooDeep);
        const bool object = *at_++ == '{';
        if (depth == 0) out_.object = object;
        return object ? members(depth + 1) : elements(depth + 1);
      }
      case '"':
        if (member == Member::kModel) return string(&out_.model.emplace());
        if (member == Member::kUser) {
          out_.user.clear();
          return string(&out_.user);
        }
        return string(nullptr);
      case 't':
        return literal("true", member);
      case 'f':
        return literal("false", member);
      case 'n':
        return literal("null", member);
      default:
        return number(member);
    }
  }

  // An object's members after its "{", at `depth`; the top level's keys are read.
  bool members(int depth) {
    skip_space();
    if (more() && *at_ == '}') return ++at_, true;
    for (;;) {
      skip_space();
      if (!more() || *at_ != '"') return false;
      Member member = Member::kOther;
      if (depth == 1) {
        std::string_view key;
        const char* close = at_ + 1;
        while (close != end_ && kPlain[byte(*close)]) ++close;
        if (close != end_ && *close == '"') {  // nothing to decode
          key = std::string_view(at_ + 1, close - at_ - 1);
          at_ = close + 1;
        } else {
          key_.clear();
          if (!string(&key_)) return false;
          key = key_;
        }
        member = key == "model" ? Member::kModel : key == "user" ? Member::kUser : Member::kOther;
        if (member == Member::kModel && std::exchange(seen_model_, true)) return refuse(RouteFieldValues::kModelTwice);
      } else if (!string(nullptr)) {
        return false;
      }
      skip_space();
      if (!more() || *at_++ != ':') return false;
      if (!value(depth, member)) return false;
      skip_space();
      if (!more()) return false;
      const char next = *at_++;
      if (next == '}') return true;
      if (next != ',') return false;
    }
  }

  // An array's elements after its "[", at `depth`.
  bool elements(int depth) {
    skip_space();
    if (more() && *at_ == ']') return ++at_, true;
    for (;;) {
      if (!value(depth, Member::kOther)) return false;
      skip_space();
      if (!more()) return false;
      const char next = *at_++;
      if (next == ']') return true;
      if (next != ',') return false;
    }
  }

  bool literal(std::string_view word, Member member) {
    if (static_cast<std::size_t>(end_ - at_) < word.size() || std::string_view(at_, word.size()) != word) return false;
    at_ += word.size();
    return member == Member::kModel ? refuse(RouteFieldValues::kModelNotString) : true;
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, ending at the first byte that cannot go on
  // with it; refused, as nlohmann's parser refuses it, when a double cannot hold its value.
  bool number(Member member) {
    const char* start = at_;
    if (*at_ == '-') ++at_;
    if (!more() || !is_digit(*at_)) return false;
    const char* whole = at_;
    if (*at_ == '0') {
      ++at_;
    } else {
      while (more() && is_digit(*at_)) ++at_;
    }
    const char* whole_end = at_;
    const char* fraction = at_;
    if (more() && *at_ == '.') {
      fraction = ++at_;
      if (!more() || !is_digit(*at_)) return false;
      while (more() && is_digit(*at_)) ++at_;
    }
    const char* fraction_end = at_;
    long long exponent = 0;
    if (more() && (*at_ == 'e' || *at_ == 'E')) {
      ++at_;
      bool negative = false;
      if (more() && (*at_ == '+' || *at_ == '-')) negative = *at_++ == '-';
      if (!more() || !is_digit(*at_)) return false;
      for (; more() && is_digit(*at_); ++at_) {
        if (exponent < 100'000'000'000'000'000) exponent = exponent * 10 + (*at_ - '0');
      }
      if (negative) exponent = -exponent;
    }
    // The value lies in [10^(order - 1), 10^order): a double holds it below order 309, and not
    // from order 310 (DBL_MAX is 1.8e308); order 309 is settled by a conversion.
    long long order;
    if (*whole != '0') {
      order = (whole_end - whole) + exponent;
    } else {
      const char* first = fraction;
      while (first != fraction_end && *first == '0') ++first;
      if (first == fraction_end) return scalar(member);  // zero
      order = -(first - fraction) + exponent;
    }
    if (order >= 310) return false;
    if (order == 309) {
      double v;
      if (std::from_chars(start, at_, v).ec == std::errc::result_out_of_range) return false;
    }
    return scalar(member);
  }
  bool scalar(Member member) { return member == Member::kModel ? refuse(RouteFieldValues::kModelNotString) : true; }

  // A string from its opening quote, decoded into `into` unless that is null: no byte below
  // 0x20, UTF-8 that RFC 3629 allows, the eight escapes and \u with its surrogate pairs.
  bool string(std::string* into) {
    ++at_;
    for (;;) {
      const char* run = at_;
      while (more() && kPlain[byte(*at_)]) ++at_;
      if (into) into->append(run, at_);
      if (!more()) return false;
      const unsigned c = byte(*at_);
      if (c == '"') return ++at_, true;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (!escape(into)) return false;
        continue;
      }
      const char* character = at_;
      if (!utf8()) return false;
      if (into) into->append(character, at_);
    }
  }

  // One character of two to four bytes, from its lead byte.
  bool utf8() {
    const unsigned lead = byte(*at_++);
    unsigned low = 0x80, high = 0xBF;  // the range of the byte after the lead
    int follow;
    if (lead >= 0xC2 && lead <= 0xDF) {
      follow = 1;
    } else if (lead == 0xE0) {
      follow = 2, low = 0xA0;
    } else if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) {
      follow = 2;
    } else if (lead == 0xED) {
      follow = 2, high = 0x9F;
    } else if (lead == 0xF0) {
      follow = 3, low = 0x90;
    } else if (lead >= 0xF1 && lead <= 0xF3) {
      follow = 3;
    } else if (lead == 0xF4) {
      follow = 3, high = 0x8F;
    } else {
      return false;
    }
    for (int i = 0; i < follow; ++i, low = 0x80, high = 0xBF) {
      if (!more() || byte(*at_) < low || byte(*at_) > high) return false;
      ++at_;
    }
    return true;
  }

  bool escape(std::string* into) {
    ++at_;
    if (!more()) return false;
    char decoded;
    switch (*at_++) {
      case '"': decoded = '"'; break;
      case '\\': decoded = '\\'; break;
      case '/': decoded = '/'; break;
      case 'b': decoded = '\b'; break;
      case 'f': decoded = '\f'; break;
      case 'n': decoded = '\n'; break;
      case 'r': decoded = '\r'; break;
      case 't': decoded = '\t'; break;
      case 'u': return unicode(into);
      default: return false;
    }
    if (into) into->push_back(decoded);
    return true;
  }

  // Four hex digits, or -1.
  int hex4() {
    if (end_ - at_ < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = at_[i];
      const int d = is_digit(c) ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    at_ += 4;
    return v;
  }

  // After "\u": a code point, a high surrogate only with the low one after it.
  bool unicode(std::string* into) {
    int cp = hex4();
    if (cp < 0) return false;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (end_ - at_ < 2 || at_[0] != '\\' || at_[1] != 'u') return false;
      at_ += 2;
      const int low = hex4();
      if (low < 0xDC00 || low > 0xDFFF) return false;
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
      return false;
    }
    if (into) text::utf8_append(*into, static_cast<char32_t>(cp));
    return true;
  }

  const char* at_;
  const char* end_;
  RouteFieldValues& out_;
  std::string key_;  // a top-level key, decoded
  bool seen_model_ = false;
};

}  // namespace

bool scan_route_fields(std::string_view body, RouteFieldValues& out) { return Scan(body, out).document(); }

}  // namespace lmserve::gateway
