#include "gateway/answer.h"

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

void AnswerReader::read_whole(std::string_view body) {
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
