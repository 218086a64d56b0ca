// gateway/answer: what the gateway reads from a replica's answer as it passes through: the token
// counts the replica reports (OpenAI's `usage`) and, when asked, the generated text. A JSON answer
// is read once; a streamed one (SSE) is fed its body bytes as they pass, however the reads cut its
// lines. Events are parsed only when they can matter: every one when the text is collected, else
// only those that mention usage.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace lmserve::gateway {

struct Usage {
  std::int64_t prompt_tokens = -1, completion_tokens = -1;  // -1: not reported
  bool known() const { return prompt_tokens >= 0 && completion_tokens >= 0; }
};

class AnswerReader {
 public:
  explicit AnswerReader(bool collect_text) : collect_(collect_text) {}
  void feed_stream(std::string_view bytes);  // SSE body bytes, in order
  void read_whole(std::string_view body);    // a JSON answer's body
  const Usage& usage() const { return usage_; }
  const std::string& text() const { return text_; }  // the choices' text, in the order it came

 private:
  void on_line(std::string_view line);
  void take(const nlohmann::json& j, bool delta);
  static constexpr std::size_t kMaxLine = 4 << 20;  // longer event lines are not read
  bool collect_;
  bool overlong_ = false;  // the current line passed kMaxLine: skipped to its end
  std::string line_;
  Usage usage_;
  std::string text_;
};

}  // namespace lmserve::gateway
