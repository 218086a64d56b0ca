#include "text/jinja/lexer.h"

#include <cctype>
#include <charconv>

#include "text/utf8.h"

namespace lmserve::text::jinja {

Status syntax_error(int line, int col, const std::string& msg) {
  return Status(StatusCode::kInvalidArgument,
                "template syntax error at line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + msg);
}

namespace {

bool is_py_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(std::string_view raw) {
    // Newlines become \n and one trailing newline is dropped (keep_trailing_newline=False).
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\r') {
        src_ += '\n';
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
      } else {
        src_ += raw[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  Result<std::vector<Token>> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      std::size_t tag = find_tag(pos_);
      std::string text = src_.substr(pos_, tag - pos_);
      if (tag == src_.size()) {
        emit_text(std::move(text), pos_);
        pos_ = tag;
        break;
      }
      char kind = src_[tag + 1];  // '{', '%' or '#'
      char mod = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && is_py_space(text.back())) text.pop_back();
      } else if ((kind == '%' || kind == '#') && mod != '+') {
        std::size_t l = text.rfind('\n');
        std::size_t lpos = l == std::string::npos ? 0 : l + 1;
        if (lpos > 0 || line_starting) {
          bool blank = true;
          for (std::size_t i = lpos; i < text.size(); ++i) blank = blank && (text[i] == ' ' || text[i] == '\t');
          if (blank) text.resize(lpos);
        }
      }
      emit_text(std::move(text), pos_);
      std::size_t inner = tag + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        std::size_t end = src_.find("#}", inner);
        if (end == std::string::npos) return error(error_at(tag, "unterminated comment"));
        bool strip = end > inner && src_[end - 1] == '-';
        pos_ = end + 2;
        line_starting = after_tag_end(strip, end > inner && src_[end - 1] == '+', true);
        continue;
      }
      if (kind == '%' && is_raw(inner)) {
        LMSERVE_RETURN_IF_ERROR(lex_raw(tag));
        line_starting = false;
        continue;
      }
      tokens_.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", line_of(tag), col_of(tag)});
      pos_ = inner;
      LMSERVE_RETURN_IF_ERROR(lex_inside(kind == '{' ? '}' : '%'));
      // pos_ is just past the closing "}}" / "%}"; its '-' / '+' was noted in last_end_mod_.
      line_starting = after_tag_end(last_end_mod_ == '-', last_end_mod_ == '+', kind == '%');
    }
    tokens_.push_back({Tok::kEof, "", line_of(src_.size()), col_of(src_.size())});
    return std::move(tokens_);
  }

 private:
  std::size_t find_tag(std::size_t from) const {
    for (std::size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return src_.size();
  }

  // Applies what follows a tag end; returns whether the consumed text ended with a newline.
  bool after_tag_end(bool strip_ws, bool plus, bool is_block) {
    bool newline = false;
    if (strip_ws) {
      while (pos_ < src_.size() && is_py_space(src_[pos_])) newline = src_[pos_++] == '\n';
    } else if (is_block && !plus && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;  // trim_blocks
      newline = true;
    }
    return newline;
  }

  void emit_text(std::string text, std::size_t at) {
    if (!text.empty()) tokens_.push_back({Tok::kText, std::move(text), line_of(at), col_of(at)});
  }

  bool is_raw(std::size_t p) const {
    while (p < src_.size() && is_py_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_py_space(src_[p])) ++p;
    if (p < src_.size() && src_[p] == '-') ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  Status lex_raw(std::size_t tag) {
    std::size_t start = src_.find("%}", tag) + 2;
    if (src_[start - 3] == '-') {
      while (start < src_.size() && is_py_space(src_[start])) ++start;
    }
    for (std::size_t p = src_.find("{%", start); p != std::string::npos; p = src_.find("{%", p + 2)) {
      std::size_t q = p + 2;
      bool strip_before = q < src_.size() && src_[q] == '-';
      if (strip_before || (q < src_.size() && src_[q] == '+')) ++q;
      while (q < src_.size() && is_py_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_py_space(src_[q])) ++q;
      bool strip_after = q < src_.size() && src_[q] == '-';
      if (strip_after) ++q;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(start, p - start);
      if (strip_before) {
        while (!text.empty() && is_py_space(text.back())) text.pop_back();
      }
      emit_text(std::move(text), start);
      pos_ = q + 2;
      after_tag_end(strip_after, false, true);
      return Status::ok();
    }
    return error_at(tag, "unterminated raw block");
  }

  Status lex_inside(char closer) {
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "(",
                                 ")", "[", "]", "{", "}", ",", ".", ":", "|", "=", ";"};
    while (true) {
      while (pos_ < src_.size() && is_py_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) return error_at(pos_, closer == '}' ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      char c = src_[pos_];
      // Tag end, with an optional '-' or '+' modifier.
      char mod = (c == '-' || c == '+') ? c : '\0';
      std::size_t e = pos_ + (mod ? 1 : 0);
      if (e + 1 < src_.size() && src_[e] == closer && src_[e + 1] == '}') {
        if (!(closer == '}' && mod == '+')) {
          tokens_.push_back({closer == '}' ? Tok::kVarEnd : Tok::kBlockEnd, "", line_of(pos_), col_of(pos_)});
          last_end_mod_ = mod;
          pos_ = e + 2;
          return Status::ok();
        }
      }
      std::size_t start = pos_;
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
        tokens_.push_back({Tok::kName, src_.substr(start, pos_ - start), line_of(start), col_of(start)});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        bool is_float = false;
        while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
        if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
          is_float = true;
          ++pos_;
          while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
        }
        if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
          std::size_t q = pos_ + 1;
          if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
            is_float = true;
            pos_ = q;
            while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
          }
        }
        std::string num;
        for (std::size_t i = start; i < pos_; ++i) {
          if (src_[i] != '_') num += src_[i];
        }
        tokens_.push_back({is_float ? Tok::kFloat : Tok::kInt, num, line_of(start), col_of(start)});
      } else if (c == '\'' || c == '"') {
        std::string s;
        LMSERVE_RETURN_IF_ERROR(lex_string(c, &s));
        tokens_.push_back({Tok::kString, std::move(s), line_of(start), col_of(start)});
      } else {
        bool matched = false;
        for (const char* op : kOps) {
          std::size_t n = std::char_traits<char>::length(op);
          if (src_.compare(pos_, n, op) == 0) {
            tokens_.push_back({Tok::kOp, op, line_of(start), col_of(start)});
            pos_ += n;
            matched = true;
            break;
          }
        }
        if (!matched) return error_at(pos_, std::string("unexpected character '") + c + "'");
      }
    }
  }

  Status lex_string(char quote, std::string* out) {
    std::size_t start = pos_++;
    while (pos_ < src_.size() && src_[pos_] != quote) {
      char c = src_[pos_++];
      if (c != '\\' || pos_ >= src_.size()) {
        *out += c;
        continue;
      }
      char e = src_[pos_++];
      switch (e) {
        case 'n': *out += '\n'; break;
        case 't': *out += '\t'; break;
        case 'r': *out += '\r'; break;
        case '0': *out += '\0'; break;
        case 'a': *out += '\a'; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'v': *out += '\v'; break;
        case '\\': *out += '\\'; break;
        case '\'': *out += '\''; break;
        case '"': *out += '"'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos_ + n > src_.size()) return error_at(start, "truncated escape in string");
          unsigned cp = 0;
          auto r = std::from_chars(src_.data() + pos_, src_.data() + pos_ + n, cp, 16);
          if (r.ptr != src_.data() + pos_ + n || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return error_at(start, "bad escape in string");
          }
          utf8_append(*out, cp);
          pos_ += n;
          break;
        }
        default:
          *out += '\\';
          *out += e;
      }
    }
    if (pos_ >= src_.size()) return error_at(start, "unterminated string");
    ++pos_;
    return Status::ok();
  }

  int line_of(std::size_t p) {
    while (line_pos_ < p && line_pos_ < src_.size()) {
      if (src_[line_pos_] == '\n') {
        ++line_;
        line_start_ = line_pos_ + 1;
      }
      ++line_pos_;
    }
    return line_;
  }
  int col_of(std::size_t p) {
    line_of(p);
    return static_cast<int>(p - line_start_) + 1;
  }
  Status error_at(std::size_t p, const std::string& msg) { return syntax_error(line_of(p), col_of(p), msg); }

  std::string src_;
  std::size_t pos_ = 0;
  std::vector<Token> tokens_;
  char last_end_mod_ = '\0';
  std::size_t line_pos_ = 0, line_start_ = 0;
  int line_ = 1;
};

}  // namespace

Result<std::vector<Token>> lex_template(std::string_view source) {
  Lexer lexer(source);
  return lexer.run();
}

}  // namespace lmserve::text::jinja
