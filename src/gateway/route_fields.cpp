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

// Where a value stands: the top level's routing members, and with the policies' fields what they
// read of "prompt", "messages" and the token limits.
enum class Member {
  kOther, kModel, kUser, kStream,
  kPrompt, kPromptItem, kMaxTokens, kMaxCompletionTokens,
  kMessages, kMessage, kRole, kContent, kPart, kPartText,
};
// Whose members an object's are: the top level's, a message's, a content part's, or none read.
enum class Level { kOther, kTop, kMessage, kPart };

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
  Scan(std::string_view text, RouteFieldValues& out, PolicyFieldValues* policy)
      : at_(text.data()), end_(text.data() + text.size()), out_(out), policy_(policy) {}

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
        if (member == Member::kRole) guarded_role_ = true;  // not a string: the user's
        if (object) {
          if (member == Member::kMessage) return message(depth + 1);
          if (member == Member::kPart) return part(depth + 1);
          return members(depth + 1, depth == 0 ? Level::kTop : Level::kOther);
        }
        const Member item = member == Member::kPrompt     ? Member::kPromptItem
                            : member == Member::kMessages ? Member::kMessage
                            : member == Member::kContent  ? Member::kPart
                                                          : Member::kOther;
        return elements(depth + 1, item);
      }
      case '"':
        return string_value(member);
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

  bool string_value(Member member) {
    switch (member) {
      case Member::kModel: return string(&out_.model.emplace());
      case Member::kUser: out_.user.clear(); return string(&out_.user);
      case Member::kPrompt:
      case Member::kPromptItem: {
        auto& text = policy_->prompt_texts.emplace_back();
        if (!string(&text)) return false;
        policy_->prompt_bytes += text.size();
        return true;
      }
      case Member::kRole: {
        role_.clear();
        if (!string(&role_)) return false;
        guarded_role_ = role_ == "user" || role_ == "tool" || role_ == "function";
        return true;
      }
      case Member::kContent: {
        auto& text = policy_->message_texts.emplace_back();
        if (!string(&text)) return false;
        content_bytes_ += text.size();
        return true;
      }
      case Member::kPart: return string(&policy_->message_texts.emplace_back());  // guarded, not counted
      case Member::kPartText: part_text_.clear(); return part_has_text_ = string(&part_text_);
      default: return string(nullptr);
    }
  }

  // An object's members after its "{", at `depth`; the keys of the top level, a message and a
  // content part are read.
  bool members(int depth, Level level) {
    skip_space();
    if (more() && *at_ == '}') return ++at_, true;
    for (;;) {
      skip_space();
      if (!more() || *at_ != '"') return false;
      Member member = Member::kOther;
      if (level != Level::kOther) {
        std::string_view key;
        if (!read_key(key)) return false;
        member = member_of(level, key);
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

  // A key from its opening quote, decoded (into key_ when it has escapes).
  bool read_key(std::string_view& key) {
    const char* close = at_ + 1;
    while (close != end_ && kPlain[byte(*close)]) ++close;
    if (close != end_ && *close == '"') {  // nothing to decode
      key = std::string_view(at_ + 1, close - at_ - 1);
      at_ = close + 1;
      return true;
    }
    key_.clear();
    if (!string(&key_)) return false;
    key = key_;
    return true;
  }

  // What a member of `level` named `key` is; a key given again starts its value afresh, as the
  // document keeps the last.
  Member member_of(Level level, std::string_view key) {
    if (level == Level::kTop) {
      if (key == "model") return Member::kModel;
      if (key == "user") return Member::kUser;
      if (key == "stream") return out_.stream = false, Member::kStream;
      if (!policy_) return Member::kOther;
      if (key == "prompt") {
        policy_->prompt_texts.clear();
        policy_->prompt_bytes = 0;
        return Member::kPrompt;
      }
      if (key == "messages") {
        policy_->message_texts.clear();
        policy_->message_bytes = 0;
        return Member::kMessages;
      }
      if (key == "max_tokens") return policy_->max_tokens.reset(), Member::kMaxTokens;
      if (key == "max_completion_tokens") return policy_->max_completion_tokens.reset(), Member::kMaxCompletionTokens;
      return Member::kOther;
    }
    if (level == Level::kMessage) {
      if (key == "role") return guarded_role_ = true, Member::kRole;
      if (key == "content") {
        policy_->message_texts.resize(message_at_);
        content_bytes_ = 0;
        return Member::kContent;
      }
      return Member::kOther;
    }
    if (key == "text") return part_has_text_ = false, Member::kPartText;
    return Member::kOther;
  }

  // A message (an object in "messages"): its texts stay guarded if its role is the user's; its
  // bytes count whatever the role.
  bool message(int depth) {
    message_at_ = policy_->message_texts.size();
    guarded_role_ = true;
    content_bytes_ = 0;
    if (!members(depth, Level::kMessage)) return false;
    policy_->message_bytes += 12 + content_bytes_;
    if (!guarded_role_) policy_->message_texts.resize(message_at_);
    return true;
  }

  // A content part that is an object: its last "text", if a string.
  bool part(int depth) {
    part_has_text_ = false;
    if (!members(depth, Level::kPart)) return false;
    if (part_has_text_) {
      content_bytes_ += part_text_.size();
      policy_->message_texts.push_back(part_text_);
    }
    return true;
  }

  // An array's elements after its "[", at `depth`, each standing as `item`.
  bool elements(int depth, Member item) {
    skip_space();
    if (more() && *at_ == ']') return ++at_, true;
    for (;;) {
      if (!value(depth, item)) return false;
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
    if (member == Member::kStream) out_.stream = word == "true";
    return scalar(member);
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
    const bool integral = fraction_end == whole_end;  // so far: no fraction
    long long exponent = 0;
    bool has_exponent = false;
    if (more() && (*at_ == 'e' || *at_ == 'E')) {
      has_exponent = true;
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
    long long order = 0;
    bool zero = false;
    if (*whole != '0') {
      order = (whole_end - whole) + exponent;
    } else {
      const char* first = fraction;
      while (first != fraction_end && *first == '0') ++first;
      zero = first == fraction_end;
      order = -(first - fraction) + exponent;
    }
    if (!zero && order >= 310) return false;
    if (!zero && order == 309) {
      double v;
      if (std::from_chars(start, at_, v).ec == std::errc::result_out_of_range) return false;
    }
    if (integral && !has_exponent && member != Member::kOther) integer(member, start);
    return scalar(member);
  }

  // A number written as an integer, where the policies read one: nlohmann holds it as an
  // integer when a 64-bit integer does (signed below zero, unsigned above), else as a double.
  void integer(Member member, const char* start) {
    std::int64_t v = 0;
    const bool fits_signed = std::from_chars(start, at_, v).ec == std::errc();
    if (member == Member::kPromptItem) {
      std::uint64_t u = 0;
      if (fits_signed || (*start != '-' && std::from_chars(start, at_, u).ec == std::errc())) policy_->prompt_bytes += 3;  // a token id
    } else if (fits_signed && v >= 0) {
      if (member == Member::kMaxTokens) policy_->max_tokens = v;
      if (member == Member::kMaxCompletionTokens) policy_->max_completion_tokens = v;
    }
  }

  bool scalar(Member member) {
    if (member == Member::kRole) guarded_role_ = true;  // not a string: the user's
    return member == Member::kModel ? refuse(RouteFieldValues::kModelNotString) : true;
  }

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
  PolicyFieldValues* policy_;  // null: the routing fields only
  std::string key_;  // a key being read, decoded
  bool seen_model_ = false;
  // The message and content part being read (neither nests in itself).
  std::size_t message_at_ = 0;  // its first text in message_texts
  bool guarded_role_ = true;
  std::size_t content_bytes_ = 0;
  std::string role_, part_text_;
  bool part_has_text_ = false;
};

}  // namespace

PolicyFieldValues policy_fields(const nlohmann::json& body) {
  PolicyFieldValues out;
  if (!body.is_object()) return out;
  if (auto p = body.find("prompt"); p != body.end()) {
    auto take = [&](const nlohmann::json& v) {
      if (!v.is_string()) return;
      out.prompt_texts.push_back(v.get<std::string>());
      out.prompt_bytes += out.prompt_texts.back().size();
    };
    take(*p);
    if (p->is_array()) {
      for (const auto& v : *p) {
        take(v);
        if (v.is_number_integer()) out.prompt_bytes += 3;  // a token id
      }
    }
  }
  if (auto m = body.find("messages"); m != body.end() && m->is_array()) {
    for (const auto& msg : *m) {
      if (!msg.is_object()) continue;
      out.message_bytes += 12;  // the role's markers
      // The application's own roles are left out; a role that is missing or not a string (the
      // replica refuses it) is read as the user's.
      bool guarded = true;
      if (auto r = msg.find("role"); r != msg.end() && r->is_string()) {
        const auto& role = r->get_ref<const std::string&>();
        guarded = role == "user" || role == "tool" || role == "function";
      }
      auto c = msg.find("content");
      if (c == msg.end()) continue;
      if (c->is_string()) {
        out.message_bytes += c->get_ref<const std::string&>().size();
        if (guarded) out.message_texts.push_back(c->get<std::string>());
      }
      if (!c->is_array()) continue;
      for (const auto& part : *c) {
        if (part.is_string() && guarded) out.message_texts.push_back(part.get<std::string>());
        if (!part.is_object()) continue;
        const auto t = part.find("text");
        if (t == part.end() || !t->is_string()) continue;
        out.message_bytes += t->get_ref<const std::string&>().size();
        if (guarded) out.message_texts.push_back(t->get<std::string>());
      }
    }
  }
  for (auto [name, into] : {std::pair{"max_completion_tokens", &out.max_completion_tokens}, std::pair{"max_tokens", &out.max_tokens}}) {
    if (auto v = body.find(name); v != body.end() && v->is_number_integer() && v->get<std::int64_t>() >= 0) *into = v->get<std::int64_t>();
  }
  return out;
}

bool scan_route_fields(std::string_view body, RouteFieldValues& out, PolicyFieldValues* policy) { return Scan(body, out, policy).document(); }

}  // namespace lmserve::gateway
