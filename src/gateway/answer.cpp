#include "gateway/answer.h"

#include <limits>
#include <nlohmann/json.hpp>

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

// The top-level object's `usage`, read without building the document (an answer's text, its
// choices and their logprobs are only lexed): what take() reads from it, with the same outcome
// for duplicate keys (the last one counts) and a body that does not parse (nothing).
class UsageSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool found = false;  // the top level is an object with a `usage` object
  Usage usage;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t v) override { return count(v); }
  bool number_unsigned(number_unsigned_t v) override {
    return v <= static_cast<number_unsigned_t>(std::numeric_limits<std::int64_t>::max()) ? count(static_cast<std::int64_t>(v)) : value();
  }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    nested();
    ++depth_;
    if (depth_ == 2 && field_ == Field::kUsage) {
      found = true;
      usage = {};  // a later `usage` replaces an earlier one
      in_usage_ = true;
    }
    field_ = Field::kOther;
    return true;
  }
  bool end_object() override {
    if (depth_ == 2) in_usage_ = false;
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    nested();
    if (depth_ == 1 && field_ == Field::kUsage) usage = {}, found = false;  // `usage` not an object
    ++depth_;
    field_ = Field::kOther;
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    field_ = Field::kOther;
    if (depth_ == 1 && k == "usage") field_ = Field::kUsage;
    if (depth_ == 2 && in_usage_) field_ = k == "prompt_tokens" ? Field::kPrompt : k == "completion_tokens" ? Field::kCompletion : Field::kOther;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  enum class Field { kOther, kUsage, kPrompt, kCompletion };
  bool value() {
    if (depth_ == 1 && field_ == Field::kUsage && found) usage = {}, found = false;  // `usage` not an object (the last one counts)
    if (depth_ == 2 && in_usage_ && field_ != Field::kOther) set(-1);
    field_ = Field::kOther;
    return true;
  }
  bool count(std::int64_t v) {
    if (depth_ == 2 && in_usage_ && field_ != Field::kOther) {
      set(v >= 0 ? v : -1);
      field_ = Field::kOther;
      return true;
    }
    return value();
  }
  void nested() {  // an object or array begins
    if (depth_ == 2 && in_usage_ && field_ != Field::kOther) set(-1);  // a count that is not a number
  }
  void set(std::int64_t v) { (field_ == Field::kPrompt ? usage.prompt_tokens : usage.completion_tokens) = v; }
  int depth_ = 0;
  bool in_usage_ = false;
  Field field_ = Field::kOther;
};

}  // namespace

void AnswerReader::read_whole(std::string_view body) {
  if (!collect_) {
    UsageSax sax;
    if (nlohmann::json::sax_parse(body, &sax) && sax.found) usage_ = sax.usage;
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
