#include "text/json_prefix.h"

namespace lmserve::text {

namespace {

constexpr std::string_view kLiterals[] = {"true", "false", "null"};

bool is_space(unsigned char b) { return b == ' ' || b == '\n' || b == '\r' || b == '\t'; }
bool is_digit(unsigned char b) { return b >= '0' && b <= '9'; }
bool is_hex(unsigned char b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

}  // namespace

bool JsonPrefix::advance(unsigned char b) {
  const JsonPrefix before = *this;
  if (step(b)) return true;
  *this = before;
  return false;
}

bool JsonPrefix::advance(std::string_view bytes) {
  const JsonPrefix before = *this;
  for (unsigned char b : bytes) {
    if (!step(b)) {
      *this = before;
      return false;
    }
  }
  return true;
}

bool JsonPrefix::complete() const {
  if (mode_ == Mode::kDone) return true;
  const bool number_end = mode_ == Mode::kNumZero || mode_ == Mode::kNumInt || mode_ == Mode::kNumFrac || mode_ == Mode::kNumExp;
  return number_end && depth_ == 0;
}

JsonPrefix::Key JsonPrefix::key() const {
  std::uint64_t rest = static_cast<std::uint64_t>(mode_);
  rest = rest << 8 | depth_;
  rest = rest << 1 | key_;
  rest = rest << 3 | hex_left_;
  rest = rest << 2 | utf8_left_;
  rest = rest << 8 | utf8_lo_;
  rest = rest << 8 | utf8_hi_;
  rest = rest << 2 | lit_;
  rest = rest << 3 | lit_pos_;
  rest = rest << 8 | spaces_;
  // The options are the same for every state a cache sees (one grammar per request).
  return {depth_ == 0 ? 0 : stack_ & (~std::uint64_t{0} >> (64 - depth_)), rest};
}

// Whitespace where the grammar allows it, at most max_space_run in a row.
bool JsonPrefix::space(unsigned char b) {
  if (!is_space(b) || spaces_ >= opt_.max_space_run) return false;
  ++spaces_;
  return true;
}

void JsonPrefix::value_done() {
  if (depth_ == 0) {
    mode_ = Mode::kDone;
  } else {
    mode_ = top_is_object() ? Mode::kObjNext : Mode::kArrNext;
  }
}

bool JsonPrefix::value_start(unsigned char b) {
  const bool top = depth_ == 0;
  if (top && opt_.object_only && b != '{') return false;
  switch (b) {
    case '{':
    case '[':
      if (depth_ >= opt_.max_depth || depth_ >= 64) return false;
      stack_ = (stack_ & ~(std::uint64_t{1} << depth_)) | (std::uint64_t{b == '{'} << depth_);
      ++depth_;
      mode_ = b == '{' ? Mode::kObjFirst : Mode::kArrFirst;
      return true;
    case '"':
      key_ = false;
      mode_ = Mode::kString;
      return true;
    case '-':
      mode_ = Mode::kNumMinus;
      return true;
    case '0':
      mode_ = Mode::kNumZero;
      return true;
    default:
      break;
  }
  if (b >= '1' && b <= '9') {
    mode_ = Mode::kNumInt;
    return true;
  }
  for (std::uint8_t i = 0; i < 3; ++i) {
    if (b == static_cast<unsigned char>(kLiterals[i][0])) {
      lit_ = i;
      lit_pos_ = 1;
      mode_ = Mode::kLiteral;
      return true;
    }
  }
  return false;
}

// A byte inside a string: escapes, UTF-8 sequences checked as they come, no control bytes.
bool JsonPrefix::string_byte(unsigned char b) {
  if (utf8_left_ > 0) {
    if (b < utf8_lo_ || b > utf8_hi_) return false;
    --utf8_left_;
    utf8_lo_ = 0x80;
    utf8_hi_ = 0xBF;
    return true;
  }
  if (b == '"') {
    if (key_) {
      key_ = false;
      mode_ = Mode::kColon;
    } else {
      value_done();
    }
    return true;
  }
  if (b == '\\') {
    mode_ = Mode::kEscape;
    return true;
  }
  if (b < 0x20) return false;
  if (b < 0x80) return true;
  // A lead byte: how many continuation bytes, and the range of the first (no overlong forms,
  // no surrogates, nothing past U+10FFFF).
  if (b >= 0xC2 && b <= 0xDF) {
    utf8_left_ = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    utf8_left_ = 2;
    if (b == 0xE0) utf8_lo_ = 0xA0;
    if (b == 0xED) utf8_hi_ = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    utf8_left_ = 3;
    if (b == 0xF0) utf8_lo_ = 0x90;
    if (b == 0xF4) utf8_hi_ = 0x8F;
  } else {
    return false;
  }
  return true;
}

bool JsonPrefix::step(unsigned char b) {
  if (!is_space(b) || mode_ == Mode::kString) spaces_ = 0;
  switch (mode_) {
    case Mode::kValue:
      return space(b) || value_start(b);
    case Mode::kObjFirst:
      if (b == '}') {
        --depth_;
        value_done();
        return true;
      }
      [[fallthrough]];
    case Mode::kObjKey:
      if (b == '"') {
        key_ = true;
        mode_ = Mode::kString;
        return true;
      }
      return space(b);
    case Mode::kColon:
      if (b == ':') {
        mode_ = Mode::kValue;
        return true;
      }
      return space(b);
    case Mode::kObjNext:
    case Mode::kArrNext: {
      const bool object = mode_ == Mode::kObjNext;
      if (b == ',') {
        mode_ = object ? Mode::kObjKey : Mode::kValue;
        return true;
      }
      if (b == (object ? '}' : ']')) {
        --depth_;
        value_done();
        return true;
      }
      return space(b);
    }
    case Mode::kArrFirst:
      if (b == ']') {
        --depth_;
        value_done();
        return true;
      }
      return space(b) || value_start(b);
    case Mode::kString:
      return string_byte(b);
    case Mode::kEscape:
      if (b == 'u') {
        hex_left_ = 4;
        mode_ = Mode::kHex;
        return true;
      }
      if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
        mode_ = Mode::kString;
        return true;
      }
      return false;
    case Mode::kHex:
      if (!is_hex(b)) return false;
      if (--hex_left_ == 0) mode_ = Mode::kString;
      return true;
    case Mode::kNumMinus:
      if (b == '0') mode_ = Mode::kNumZero;
      else if (b >= '1' && b <= '9') mode_ = Mode::kNumInt;
      else return false;
      return true;
    case Mode::kNumZero:
    case Mode::kNumInt:
      if (is_digit(b) && mode_ == Mode::kNumInt) return true;
      if (b == '.') {
        mode_ = Mode::kNumDot;
        return true;
      }
      if (b == 'e' || b == 'E') {
        mode_ = Mode::kNumE;
        return true;
      }
      value_done();  // the number ended; the byte belongs to what follows
      return step(b);
    case Mode::kNumDot:
      if (!is_digit(b)) return false;
      mode_ = Mode::kNumFrac;
      return true;
    case Mode::kNumFrac:
      if (is_digit(b)) return true;
      if (b == 'e' || b == 'E') {
        mode_ = Mode::kNumE;
        return true;
      }
      value_done();
      return step(b);
    case Mode::kNumE:
      if (b == '+' || b == '-') {
        mode_ = Mode::kNumESign;
        return true;
      }
      [[fallthrough]];
    case Mode::kNumESign:
      if (!is_digit(b)) return false;
      mode_ = Mode::kNumExp;
      return true;
    case Mode::kNumExp:
      if (is_digit(b)) return true;
      value_done();
      return step(b);
    case Mode::kLiteral: {
      const auto lit = kLiterals[lit_];
      if (b != static_cast<unsigned char>(lit[lit_pos_])) return false;
      if (++lit_pos_ == lit.size()) value_done();
      return true;
    }
    case Mode::kDone:
      return space(b);
  }
  return false;
}

}  // namespace lmserve::text
