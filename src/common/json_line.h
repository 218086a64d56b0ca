// common/json_line: one JSON object written field by field straight into its text, with no
// document in between (audit and log records on the request path: a document of a dozen fields
// cost a map node and a string per field, then a walk to serialise it). Fields appear in the
// order they are added; keys are the caller's literals and are written as given. String values
// are escaped as JSON requires, and bytes that are not UTF-8 become U+FFFD, so the text always
// parses (and never throws, whatever a client sent).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lmserve {

class JsonLine {
 public:
  JsonLine() {
    text_.reserve(384);
    text_ += '{';
  }
  JsonLine& str(std::string_view key, std::string_view value);
  JsonLine& num(std::string_view key, std::int64_t value);
  JsonLine& real(std::string_view key, double value);  // shortest round trip; null when not finite
  // A duration given in seconds, written in milliseconds to the microsecond ("0.753", "12.5",
  // "2000"): what a latency needs, cheaper and shorter than real()'s round trip. Null when not
  // finite.
  JsonLine& millis(std::string_view key, double seconds);
  JsonLine& boolean(std::string_view key, bool value);
  JsonLine& null(std::string_view key);
  // The object's text, closed; the line is spent.
  std::string done() &&;

 private:
  void key(std::string_view k);
  void field(std::string_view k, std::string_view value, bool quoted);
  std::string text_;
};

// `value` as a JSON string's content (no quotes): escaped, with bytes that are not UTF-8 as U+FFFD.
void append_json_escaped(std::string& out, std::string_view value);

}  // namespace lmserve
