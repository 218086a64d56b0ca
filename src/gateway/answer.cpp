#include "gateway/answer.h"

#include <array>
#include <boost/container/small_vector.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <nlohmann/json.hpp>

#include "text/utf8.h"

namespace lmserve::gateway {

void AnswerReader::feed_stream(std::string_view bytes) {
  while (!bytes.empty()) {
    const auto nl = bytes.find('\n');
    const auto piece = bytes.substr(0, nl);
    if (!overlong_) {
      if (line_.size() + piece.size() > kMaxLine) {
        overlong_ = true;
        line_.clear();
      } else {
        line_.append(piece);
      }
    }
    if (nl == std::string_view::npos) return;  // the line goes on in the next bytes
    if (!overlong_) on_line(line_);
    line_.clear();
    overlong_ = false;
    bytes.remove_prefix(nl + 1);
  }
}

void AnswerReader::on_line(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (!line.starts_with("data:")) return;
  line.remove_prefix(5);
  if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  if (line == "[DONE]") return;
  if (!collect_ && line.find("\"usage\"") == std::string_view::npos) return;
  const auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_object()) take(j, true);
}

namespace {

// What take() reads of the top-level object's `usage`, fed the events of a parse: the same outcome
// for duplicate keys (the last one counts), counts that are not non-negative integers (-1), and a
// `usage` that is not an object.
class UsageEvents {
 public:
  bool found = false;  // the top level is an object with a `usage` object
  Usage usage;

  void scalar() {
    if (depth_ == 1 && field_ == Field::kUsage && found) usage = {}, found = false;  // `usage` not an object (the last one counts)
    if (depth_ == 2 && in_usage_ && field_ != Field::kOther) set(-1);
    field_ = Field::kOther;
  }
  void count(std::int64_t v) {  // a non-negative integer
    if (depth_ == 2 && in_usage_ && field_ != Field::kOther) {
      set(v);
      field_ = Field::kOther;
      return;
    }
    scalar();
  }
  void start_object() {
    nested();
    ++depth_;
    if (depth_ == 2 && field_ == Field::kUsage) {
      found = true;
      usage = {};  // a later `usage` replaces an earlier one
      in_usage_ = true;
    }
    field_ = Field::kOther;
  }
  void end_object() {
    if (depth_ == 2) in_usage_ = false;
    --depth_;
  }
  void start_array() {
    nested();
    if (depth_ == 1 && field_ == Field::kUsage) usage = {}, found = false;  // `usage` not an object
    ++depth_;
    field_ = Field::kOther;
  }
  void end_array() { --depth_; }
  void key(std::string_view k) {
    field_ = Field::kOther;
    if (depth_ == 1 && k == "usage") field_ = Field::kUsage;
    if (depth_ == 2 && in_usage_) field_ = k == "prompt_tokens" ? Field::kPrompt : k == "completion_tokens" ? Field::kCompletion : Field::kOther;
  }
  bool wants_key() const { return depth_ == 1 || (depth_ == 2 && in_usage_); }

 private:
  enum class Field { kOther, kUsage, kPrompt, kCompletion };
  void nested() {  // an object or array begins
    if (depth_ == 2 && in_usage_ && field_ != Field::kOther) set(-1);  // a count that is not a number
  }
  void set(std::int64_t v) { (field_ == Field::kPrompt ? usage.prompt_tokens : usage.completion_tokens) = v; }
  int depth_ = 0;
  bool in_usage_ = false;
  Field field_ = Field::kOther;
};

// The bytes a JSON string holds as they are: printable ASCII but the quote and the backslash.
constexpr std::array<bool, 256> kPlain = [] {
  std::array<bool, 256> plain{};
  for (int c = 0x20; c < 0x80; ++c) plain[c] = c != '"' && c != '\\';
  return plain;
}();

// A JSON answer scanned in place, without a document or a token's copy: accepts exactly what
// nlohmann::json::parse accepts (RFC 8259, a leading UTF-8 BOM, strings of valid UTF-8 with
// paired surrogate escapes, nothing after the value but whitespace; any depth, without
// recursion) and tells `ev` the events UsageEvents needs. A key is decoded only where it can
// matter and only when it holds an escape.
class AnswerScan {
 public:
  AnswerScan(std::string_view s, UsageEvents& ev) : p_(s.data()), end_(s.data() + s.size()), ev_(ev) {}

  bool run() {
    if (p_ != end_ && static_cast<unsigned char>(*p_) == 0xEF) {  // a BOM, or nothing
      if (end_ - p_ < 3 || static_cast<unsigned char>(p_[1]) != 0xBB || static_cast<unsigned char>(p_[2]) != 0xBF) return false;
      p_ += 3;
    }
    boost::container::small_vector<char, 32> open;  // '{' / '[' per container open
    for (;;) {
      // A value.
      ws();
      if (p_ == end_) return false;
      const char c = *p_;
      if (c == '{' || c == '[') {
        const bool object = c == '{';
        ++p_;
        object ? ev_.start_object() : ev_.start_array();
        ws();
        if (p_ != end_ && *p_ == (object ? '}' : ']')) {
          ++p_;
          object ? ev_.end_object() : ev_.end_array();
        } else {
          open.push_back(c);
          if (object && !member_key()) return false;
          continue;
        }
      } else if (!scalar()) {
        return false;
      }
      // After a value: close what ends here, then the next member or element.
      for (;;) {
        ws();
        if (open.empty()) return p_ == end_ || *p_ == '\0';  // as nlohmann's parser: a NUL ends the input
        if (p_ == end_) return false;
        const char close = open.back() == '{' ? '}' : ']';
        if (*p_ == close) {
          ++p_;
          open.pop_back();
          if (close == '}') ev_.end_object();
          else ev_.end_array();
          continue;
        }
        if (*p_ != ',') return false;
        ++p_;
        if (open.back() == '{' && !member_key()) return false;
        break;
      }
    }
  }

 private:
  void ws() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  // `"key" :`, the key told to the events.
  bool member_key() {
    ws();
    if (p_ == end_ || *p_ != '"') return false;
    const char* begin = p_ + 1;
    bool escaped = false;
    if (!string(&escaped)) return false;
    if (ev_.wants_key()) {
      if (!escaped) {
        ev_.key(std::string_view(begin, static_cast<std::size_t>(p_ - 1 - begin)));
      } else {
        decoded_.clear();
        decode(begin, p_ - 1);
        ev_.key(decoded_);
      }
    } else {
      ev_.key({});
    }
    ws();
    if (p_ == end_ || *p_ != ':') return false;
    ++p_;
    return true;
  }

  bool scalar() {
    const char c = *p_;
    if (c == '"') {
      if (!string(nullptr)) return false;
      ev_.scalar();
      return true;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    for (std::string_view word : {std::string_view("true"), std::string_view("false"), std::string_view("null")}) {
      if (c == word[0]) {
        if (static_cast<std::size_t>(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word) return false;
        p_ += word.size();
        ev_.scalar();
        return true;
      }
    }
    return false;
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? ; a count only as a non-negative integer that
  // fits int64 (or -0, which nlohmann reads as the integer 0).
  bool number() {
    const char* token = p_;
    const bool negative = *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
    std::uint64_t v = 0;
    bool overflow = false;
    if (*p_ == '0') {
      ++p_;
    } else {
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') {
        const auto d = static_cast<std::uint64_t>(*p_ - '0');
        if (v > (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) - d) / 10) overflow = true;
        else v = v * 10 + d;
        ++p_;
      }
    }
    bool integer = true;
    if (p_ != end_ && *p_ == '.') {
      integer = false;
      ++p_;
      if (!digits()) return false;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      integer = false;
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digits()) return false;
    }
    // nlohmann reads what is not an integer of 64 bits as a double and refuses one that overflows.
    if ((!integer || overflow) && !std::isfinite(std::strtod(std::string(token, p_).c_str(), nullptr))) return false;
    if (integer && !overflow && (!negative || v == 0)) ev_.count(static_cast<std::int64_t>(v));
    else ev_.scalar();
    return true;
  }
  bool digits() {
    const char* from = p_;
    while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    return p_ != from;
  }

  // From the opening quote to past the closing one; false where nlohmann's lexer fails.
  bool string(bool* escaped) {
    ++p_;
    while (p_ != end_) {
      while (p_ != end_ && kPlain[static_cast<unsigned char>(*p_)]) ++p_;  // most of a string
      if (p_ == end_) break;
      const auto b = static_cast<unsigned char>(*p_);
      if (b == '"') {
        ++p_;
        return true;
      }
      if (b == '\\') {
        if (escaped != nullptr) *escaped = true;
        if (!escape(nullptr)) return false;
        continue;
      }
      if (b < 0x20) return false;
      if (b < 0x80) {
        ++p_;
        continue;
      }
      // One multi-byte character, well-formed (RFC 3629: no overlong form, surrogate or > U+10FFFF).
      char32_t cp = 0;
      const int n = text::utf8_decode(std::string_view(p_, static_cast<std::size_t>(end_ - p_)), 0, &cp);
      if (n == 0) return false;
      p_ += n;
    }
    return false;
  }

  // One escape at p_ (the backslash); its code point to `cp` when asked.
  bool escape(std::uint32_t* cp) {
    if (end_ - p_ < 2) return false;
    const char e = p_[1];
    p_ += 2;
    std::uint32_t out = 0;
    switch (e) {
      case '"': out = '"'; break;
      case '\\': out = '\\'; break;
      case '/': out = '/'; break;
      case 'b': out = '\b'; break;
      case 'f': out = '\f'; break;
      case 'n': out = '\n'; break;
      case 'r': out = '\r'; break;
      case 't': out = '\t'; break;
      case 'u': {
        std::uint32_t u = 0;
        if (!hex4(&u)) return false;
        if (u >= 0xDC00 && u <= 0xDFFF) return false;  // a low surrogate alone
        if (u >= 0xD800 && u <= 0xDBFF) {             // needs its low half next
          std::uint32_t lo = 0;
          if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return false;
          p_ += 2;
          if (!hex4(&lo) || lo < 0xDC00 || lo > 0xDFFF) return false;
          u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
        }
        out = u;
        break;
      }
      default: return false;
    }
    if (cp != nullptr) *cp = out;
    return true;
  }
  bool hex4(std::uint32_t* u) {
    if (end_ - p_ < 4) return false;
    for (int i = 0; i < 4; ++i, ++p_) {
      const char h = *p_;
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) return false;
      *u = *u * 16 + static_cast<std::uint32_t>(d);
    }
    return true;
  }

  // A key's bytes between its quotes (already checked) with its escapes decoded, to decoded_.
  void decode(const char* from, const char* to) {
    const char* keep = p_;
    p_ = from;
    while (p_ < to) {
      if (*p_ != '\\') {
        decoded_.push_back(*p_++);
        continue;
      }
      std::uint32_t cp = 0;
      escape(&cp);
      text::utf8_append(decoded_, static_cast<char32_t>(cp));
    }
    p_ = keep;
  }

  const char* p_;
  const char* end_;
  UsageEvents& ev_;
  std::string decoded_;
};

}  // namespace

void AnswerReader::read_whole(std::string_view body) {
  if (!collect_) {
    UsageEvents ev;
    if (AnswerScan(body, ev).run() && ev.found) usage_ = ev.usage;
    return;
  }
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object()) take(j, false);
}

void AnswerReader::take(const nlohmann::json& j, bool delta) {
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    auto count = [&](const char* name) -> std::int64_t {
      auto v = u->find(name);
      return v != u->end() && v->is_number_integer() && v->get<std::int64_t>() >= 0 ? v->get<std::int64_t>() : -1;
    };
    usage_ = {count("prompt_tokens"), count("completion_tokens")};
  }
  if (!collect_) return;
  auto cs = j.find("choices");
  if (cs == j.end() || !cs->is_array()) return;
  for (const auto& c : *cs) {
    if (!c.is_object()) continue;
    if (auto t = c.find("text"); t != c.end() && t->is_string()) text_ += t->get_ref<const std::string&>();
    auto m = c.find(delta ? "delta" : "message");
    if (m == c.end() || !m->is_object()) continue;
    if (auto t = m->find("content"); t != m->end() && t->is_string()) text_ += t->get_ref<const std::string&>();
  }
}

}  // namespace lmserve::gateway
