#include "text/tokenizer_parts.h"

#include <utf8proc.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "text/byte_level.h"
#include "text/utf8.h"

namespace lmserve::text {
namespace {

using json = nlohmann::json;

Status unsupported(std::string_view stage, const json& j) {
  std::string type = j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : j.dump();
  return Status(StatusCode::kInvalidArgument, "tokenizer.json: unsupported " + std::string(stage) + " '" + type + "'");
}

// The code point at `pos` (invalid bytes read as U+FFFD, length 1).
char32_t code_point_at(std::string_view s, std::size_t pos, int* len) {
  char32_t cp;
  *len = utf8_decode(s, pos, &cp);
  if (*len == 0) {
    *len = 1;
    return kReplacementChar;
  }
  return cp;
}

bool is_unicode_whitespace(char32_t c) {
  // Rust's char::is_whitespace: the White_Space property.
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Result<SplitBehavior> parse_behavior(const std::string& s) {
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  return error(StatusCode::kInvalidArgument, "tokenizer.json: unsupported split behavior '" + s + "'");
}

// Splits `piece` at `matches` the way NormalizedString::split does, appending to `out`.
void split_piece(const Piece& piece, const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<Piece>& out) {
  struct Span {
    std::size_t b, e;
    bool is_match;
  };
  std::vector<Span> spans;
  std::size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < piece.text.size()) spans.push_back({prev, piece.text.size(), invert});

  std::vector<Span> merged;  // is_match no longer meaningful after merging
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& s : spans) {
        if (!s.is_match) merged.push_back(s);
      }
      break;
    case SplitBehavior::kIsolated:
      merged = spans;
      break;
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (const auto& s : spans) {
        if (s.is_match && prev_match && !merged.empty()) {
          merged.back().e = s.e;
        } else {
          merged.push_back(s);
        }
        prev_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const auto& s : spans) {
        if (s.is_match && !prev_match && !merged.empty()) {
          merged.back().e = s.e;
        } else {
          merged.push_back(s);
        }
        prev_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;  // "previous" in reverse order: the span after
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !prev_match && !merged.empty()) {
          merged.back().b = it->b;
        } else {
          merged.push_back(*it);
        }
        prev_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
  }
  for (const auto& s : merged) {
    if (s.e > s.b) out.push_back({piece.text.substr(s.b, s.e - s.b), piece.at_start && s.b == 0});
  }
}

// ---- normalizers -------------------------------------------------------------------------

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(std::string form) : form_(std::move(form)) {}
  void normalize(std::string& s) const override { s = unicode_normalize(s, form_); }

 private:
  std::string form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    for (std::size_t i = 0; i < s.size();) {
      int n;
      char32_t c = code_point_at(s, i, &n);
      utf8_append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
      i += n;
    }
    s = std::move(out);
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    std::size_t b = 0, e = s.size();
    while (left_ && b < e) {
      int n;
      if (!is_unicode_whitespace(code_point_at(s, b, &n))) break;
      b += n;
    }
    while (right_ && e > b) {
      std::size_t p = e - 1;
      while (p > b && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
      int n;
      if (!is_unicode_whitespace(code_point_at(s, p, &n))) break;
      e = p;
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s = prepend_ + s;  // (not insert(0, ...): g++ 12 -Wrestrict false positive)
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern p, std::string c) : pattern_(std::move(p)), content_(std::move(c)) {}
  void normalize(std::string& s) const override { s = pattern_.replace_all(s, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& s) const override {
    for (const auto& p : parts_) p->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// ---- pre-tokenizers ----------------------------------------------------------------------

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (auto& p : pieces) {
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
      if (regex_) {
        split_piece(p, regex_->find_all(p.text), SplitBehavior::kIsolated, false, out);
      } else {
        out.push_back(std::move(p));
      }
    }
    for (auto& p : out) p.text = bytes_to_byte_level(p.text);
    pieces = std::move(out);
  }

 private:
  bool add_prefix_space_;
  std::optional<Regex> regex_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern p, SplitBehavior b, bool invert) : pattern_(std::move(p)), behavior_(b), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const auto& p : pieces) split_piece(p, pattern_.find_all(p.text), behavior_, invert_, out);
    pieces = std::move(out);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class RegexSplitPreTokenizer : public PreTokenizer {
 public:
  RegexSplitPreTokenizer(Regex r, SplitBehavior b, bool invert) : regex_(std::move(r)), behavior_(b), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const auto& p : pieces) split_piece(p, regex_.find_all(p.text), behavior_, invert_, out);
    pieces = std::move(out);
  }

 private:
  Regex regex_;
  SplitBehavior behavior_;
  bool invert_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (auto& p : pieces) {
      std::string t;
      for (char c : p.text) {
        if (c == ' ') {
          t += replacement_;
        } else {
          t += c;
        }
      }
      bool starts = t.starts_with(replacement_);
      if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_start))) {
        t = replacement_ + t;
      }
      Piece np{std::move(t), p.at_start};
      if (split_) {
        std::vector<std::pair<std::size_t, std::size_t>> matches;
        for (std::size_t pos = np.text.find(replacement_); pos != std::string::npos;
             pos = np.text.find(replacement_, pos + replacement_.size())) {
          matches.emplace_back(pos, pos + replacement_.size());
        }
        split_piece(np, matches, SplitBehavior::kMergedWithNext, false, out);
      } else {
        out.push_back(std::move(np));
      }
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

// ---- decoders ----------------------------------------------------------------------------

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      if (!byte_level_to_bytes(t, &bytes)) bytes += t;  // a token outside the map: its own bytes
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
  void to_bytes(std::string& token) const override {
    std::string bytes;
    if (byte_level_to_bytes(token, &bytes)) token = std::move(bytes);
  }
};

class ByteFallbackDecoder : public Decoder {
 public:
  bool groups_byte_tokens() const override { return true; }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8_is_valid(pending)) {
        out.push_back(pending);
      } else {
        for (std::size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementUtf8);
      }
      pending.clear();
    };
    for (auto& t : tokens) {
      if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
          std::isxdigit(static_cast<unsigned char>(t[4]))) {
        pending += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
  void to_bytes(std::string& t) const override {
    if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
        std::isxdigit(static_cast<unsigned char>(t[4]))) {
      t = std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
    }
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, std::size_t start, std::size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<std::size_t, char32_t>> chars;  // byte offset, code point
      for (std::size_t i = 0; i < t.size();) {
        int n;
        chars.emplace_back(i, code_point_at(t, i, &n));
        i += n;
      }
      std::size_t cut_b = 0, cut_e = chars.size();
      for (std::size_t i = 0; i < start_ && i < chars.size() && chars[i].second == content_; ++i) cut_b = i + 1;
      for (std::size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        std::size_t idx = chars.size() - i - 1;
        if (chars[idx].second != content_) break;
        cut_e = idx;
      }
      if (cut_e <= cut_b) {
        t.clear();
        continue;
      }
      std::size_t bb = cut_b < chars.size() ? chars[cut_b].first : t.size();
      std::size_t be = cut_e < chars.size() ? chars[cut_e].first : t.size();
      t = t.substr(bb, be - bb);
    }
  }

 private:
  char32_t content_;
  std::size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern p, std::string c) : pattern_(std::move(p)), content_(std::move(c)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = pattern_.replace_all(t, content_);
  }
  void to_bytes(std::string& token) const override { token = pattern_.replace_all(token, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, PrependScheme scheme) : replacement_(std::move(replacement)), scheme_(scheme) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (std::size_t p = 0; p < t.size();) {
        if (t.compare(p, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && scheme_ != PrependScheme::kNever)) out += ' ';
          p += replacement_.size();
        } else {
          out += t[p++];
        }
      }
      tokens[i] = std::move(out);
    }
  }
  void to_bytes(std::string& token) const override {  // not the first token: every replacement is a space
    std::vector<std::string> two{"", token};
    decode_chain(two);
    token = std::move(two[1]);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }
  void to_bytes(std::string& token) const override {
    for (const auto& p : parts_) p->to_bytes(token);
  }
  bool groups_byte_tokens() const override {
    return std::any_of(parts_.begin(), parts_.end(), [](const auto& p) { return p->groups_byte_tokens(); });
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// ---- post-processors ---------------------------------------------------------------------

class TemplatePostProcessor : public PostProcessor {
 public:
  // A -1 entry stands for the sequence itself.
  explicit TemplatePostProcessor(std::vector<std::int32_t> layout) : layout_(std::move(layout)) {}
  void process(std::vector<std::int32_t>& ids) const override {
    std::vector<std::int32_t> out;
    out.reserve(ids.size() + layout_.size());
    for (std::int32_t x : layout_) {
      if (x < 0) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.push_back(x);
      }
    }
    ids = std::move(out);
  }

 private:
  std::vector<std::int32_t> layout_;
};

class NoOpPostProcessor : public PostProcessor {  // ByteLevel: it only trims offsets
 public:
  void process(std::vector<std::int32_t>&) const override {}
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  void process(std::vector<std::int32_t>& ids) const override {
    for (const auto& p : parts_) p->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

Result<PrependScheme> parse_prepend_scheme(const json& j) {
  std::string scheme = j.value("prepend_scheme", std::string("always"));
  if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean() && !j["add_prefix_space"].get<bool>()) {
    scheme = "never";  // the legacy field
  }
  if (scheme == "always") return PrependScheme::kAlways;
  if (scheme == "first") return PrependScheme::kFirst;
  if (scheme == "never") return PrependScheme::kNever;
  return error(StatusCode::kInvalidArgument, "tokenizer.json: unsupported Metaspace prepend_scheme '" + scheme + "'");
}

std::string single_char_string(const json& j, const char* field) {
  return j.at(field).get<std::string>();
}

template <typename T, typename F>
Result<std::unique_ptr<T>> guarded(std::string_view stage, const json& j, F&& build) {
  try {
    return build();
  } catch (const json::exception& e) {
    return error(StatusCode::kInvalidArgument,
                 "tokenizer.json: malformed " + std::string(stage) + " " + j.dump().substr(0, 200) + ": " + e.what());
  }
}

}  // namespace

std::string unicode_normalize(std::string_view s, std::string_view form) {
  int options = UTF8PROC_STABLE;
  if (form == "NFC") options |= UTF8PROC_COMPOSE;
  if (form == "NFD") options |= UTF8PROC_DECOMPOSE;
  if (form == "NFKC") options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  if (form == "NFKD") options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &out, static_cast<utf8proc_option_t>(options));
  if (n < 0) return std::string(s);  // invalid UTF-8 cannot reach here (inputs are made valid first)
  std::string result(reinterpret_cast<char*>(out), static_cast<std::size_t>(n));
  std::free(out);
  return result;
}

Result<Pattern> Pattern::from_json(const json& j) {
  Pattern p;
  if (j.contains("String")) {
    p.literal_ = j["String"].get<std::string>();
    if (p.literal_.empty()) return error(StatusCode::kInvalidArgument, "tokenizer.json: empty String pattern");
    return p;
  }
  if (j.contains("Regex")) {
    auto r = Regex::compile(j["Regex"].get<std::string>());
    if (!r) return error(r.error().with_context("tokenizer.json pattern"));
    p.regex_ = std::move(*r);
    return p;
  }
  return error(StatusCode::kInvalidArgument, "tokenizer.json: pattern must be String or Regex: " + j.dump());
}

std::vector<std::pair<std::size_t, std::size_t>> Pattern::find_all(std::string_view s) const {
  if (regex_) return regex_->find_all(s);
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t pos = s.find(literal_); pos != std::string_view::npos; pos = s.find(literal_, pos + literal_.size())) {
    out.emplace_back(pos, pos + literal_.size());
  }
  return out;
}

std::string Pattern::replace_all(std::string_view s, std::string_view content) const {
  std::string out;
  std::size_t prev = 0;
  for (auto [b, e] : find_all(s)) {
    out.append(s.substr(prev, b - prev));
    out.append(content);
    prev = e;
  }
  out.append(s.substr(prev));
  return out;
}

Result<std::unique_ptr<Normalizer>> make_normalizer(const json& j) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  return guarded<Normalizer>("normalizer", j, [&]() -> Result<std::unique_ptr<Normalizer>> {
    std::string type = j.at("type");
    if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
      return std::make_unique<UnicodeNormalizer>(type);
    }
    if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
    if (type == "Strip") return std::make_unique<StripNormalizer>(j.value("strip_left", true), j.value("strip_right", true));
    if (type == "Prepend") return std::make_unique<PrependNormalizer>(j.at("prepend").get<std::string>());
    if (type == "Replace") {
      auto p = Pattern::from_json(j.at("pattern"));
      if (!p) return error(p.error());
      return std::make_unique<ReplaceNormalizer>(std::move(*p), j.at("content").get<std::string>());
    }
    if (type == "Sequence") {
      std::vector<std::unique_ptr<Normalizer>> parts;
      for (const auto& sub : j.at("normalizers")) {
        auto n = make_normalizer(sub);
        if (!n) return error(n.error());
        if (*n) parts.push_back(std::move(*n));
      }
      return std::make_unique<SequenceNormalizer>(std::move(parts));
    }
    return error(unsupported("normalizer", j));
  });
}

Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const json& j) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  return guarded<PreTokenizer>("pre_tokenizer", j, [&]() -> Result<std::unique_ptr<PreTokenizer>> {
    std::string type = j.at("type");
    if (type == "ByteLevel") {
      std::optional<Regex> regex;
      if (j.value("use_regex", true)) {
        auto r = Regex::compile(kGpt2Pattern);
        if (!r) return error(r.error());
        regex = std::move(*r);
      }
      return std::make_unique<ByteLevelPreTokenizer>(j.value("add_prefix_space", false), std::move(regex));
    }
    if (type == "Split") {
      auto p = Pattern::from_json(j.at("pattern"));
      if (!p) return error(p.error());
      auto b = parse_behavior(j.at("behavior").get<std::string>());
      if (!b) return error(b.error());
      return std::make_unique<SplitPreTokenizer>(std::move(*p), *b, j.value("invert", false));
    }
    if (type == "Digits") {
      auto r = Regex::compile(R"(\p{N})");
      if (!r) return error(r.error());
      auto b = j.value("individual_digits", false) ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
      return std::make_unique<RegexSplitPreTokenizer>(std::move(*r), b, false);
    }
    if (type == "Whitespace") {
      auto r = Regex::compile(R"(\w+|[^\w\s]+)");
      if (!r) return error(r.error());
      // Keeps the runs the pattern matches and drops what lies between them.
      return std::make_unique<RegexSplitPreTokenizer>(std::move(*r), SplitBehavior::kRemoved, true);
    }
    if (type == "WhitespaceSplit") {
      auto r = Regex::compile(R"(\s+)");
      if (!r) return error(r.error());
      return std::make_unique<RegexSplitPreTokenizer>(std::move(*r), SplitBehavior::kRemoved, false);
    }
    if (type == "Metaspace") {
      auto scheme = parse_prepend_scheme(j);
      if (!scheme) return error(scheme.error());
      return std::make_unique<MetaspacePreTokenizer>(single_char_string(j, "replacement"), *scheme, j.value("split", true));
    }
    if (type == "Sequence") {
      std::vector<std::unique_ptr<PreTokenizer>> parts;
      for (const auto& sub : j.at("pretokenizers")) {
        auto p = make_pre_tokenizer(sub);
        if (!p) return error(p.error());
        if (*p) parts.push_back(std::move(*p));
      }
      return std::make_unique<SequencePreTokenizer>(std::move(parts));
    }
    return error(unsupported("pre_tokenizer", j));
  });
}

Result<std::unique_ptr<Decoder>> make_decoder(const json& j) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  return guarded<Decoder>("decoder", j, [&]() -> Result<std::unique_ptr<Decoder>> {
    std::string type = j.at("type");
    if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
    if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
    if (type == "Fuse") return std::make_unique<FuseDecoder>();
    if (type == "Strip") {
      std::string content = j.at("content");
      char32_t cp = 0;
      if (utf8_decode(content, 0, &cp) != static_cast<int>(content.size()) || content.empty()) {
        return error(StatusCode::kInvalidArgument, "tokenizer.json: Strip decoder content must be one character");
      }
      return std::make_unique<StripDecoder>(cp, j.at("start").get<std::size_t>(), j.at("stop").get<std::size_t>());
    }
    if (type == "Replace") {
      auto p = Pattern::from_json(j.at("pattern"));
      if (!p) return error(p.error());
      return std::make_unique<ReplaceDecoder>(std::move(*p), j.at("content").get<std::string>());
    }
    if (type == "Metaspace") {
      auto scheme = parse_prepend_scheme(j);
      if (!scheme) return error(scheme.error());
      return std::make_unique<MetaspaceDecoder>(single_char_string(j, "replacement"), *scheme);
    }
    if (type == "Sequence") {
      std::vector<std::unique_ptr<Decoder>> parts;
      for (const auto& sub : j.at("decoders")) {
        auto d = make_decoder(sub);
        if (!d) return error(d.error());
        if (*d) parts.push_back(std::move(*d));
      }
      return std::make_unique<SequenceDecoder>(std::move(parts));
    }
    return error(unsupported("decoder", j));
  });
}

Result<std::unique_ptr<PostProcessor>> make_post_processor(const json& j) {
  if (j.is_null()) return std::unique_ptr<PostProcessor>();
  return guarded<PostProcessor>("post_processor", j, [&]() -> Result<std::unique_ptr<PostProcessor>> {
    std::string type = j.at("type");
    if (type == "ByteLevel") return std::make_unique<NoOpPostProcessor>();
    if (type == "TemplateProcessing") {
      std::vector<std::int32_t> layout;
      const json& specials = j.at("special_tokens");
      for (const auto& item : j.at("single")) {
        if (item.contains("Sequence")) {
          if (item["Sequence"].at("id") != "A") {
            return error(StatusCode::kInvalidArgument, "tokenizer.json: TemplateProcessing single uses sequence B");
          }
          layout.push_back(-1);
        } else if (item.contains("SpecialToken")) {
          std::string name = item["SpecialToken"].at("id");
          if (!specials.contains(name)) {
            return error(StatusCode::kInvalidArgument, "tokenizer.json: TemplateProcessing names unknown special token '" + name + "'");
          }
          for (const auto& id : specials[name].at("ids")) layout.push_back(id.get<std::int32_t>());
        } else {
          return error(StatusCode::kInvalidArgument, "tokenizer.json: bad TemplateProcessing item " + item.dump());
        }
      }
      return std::make_unique<TemplatePostProcessor>(std::move(layout));
    }
    if (type == "Sequence") {
      std::vector<std::unique_ptr<PostProcessor>> parts;
      for (const auto& sub : j.at("processors")) {
        auto p = make_post_processor(sub);
        if (!p) return error(p.error());
        if (*p) parts.push_back(std::move(*p));
      }
      return std::make_unique<SequencePostProcessor>(std::move(parts));
    }
    return error(unsupported("post_processor", j));
  });
}

}  // namespace lmserve::text
