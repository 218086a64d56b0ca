// gateway/route_fields: what the gateway reads of a request body to route it: in one pass of
// nlohmann's SAX parser that also builds the document (RouteFields), or, when nothing needs the
// document, in one pass of a scanner of its own (scan_route_fields).
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_depth.h"

namespace lmserve::gateway {

// The top-level fields a request is routed by.
struct RouteFieldValues {
  bool object = false;  // the body is a JSON object
  std::optional<std::string> model;
  std::string user;  // the last top-level "user" string
  bool stream = false;  // the last top-level "stream" is true: the client asks for a stream
  // Why the body is refused although it parses: "model" not a string, or given twice (two
  // readers of one body could route by one and serve the other), or nested beyond kMaxJsonDepth
  // (common/json_depth.h: serve refuses it too, and whatever reads the body after the gateway
  // need not be trusted with it).
  const char* refusal = nullptr;
  static constexpr const char* kModelNotString = "'model' must be a string";
  static constexpr const char* kModelTwice = "'model' is given twice";
  static constexpr const char* kTooDeep = "the request body is nested too deeply";
};

// What the policies read of a body (issue #30): the texts the guard checks, the prompt's size for
// the token estimate without a tokenizer, and the answer's token limit. policy_fields() reads
// them from a document; scan_route_fields, given somewhere to put them, reads the same from the
// text (a key given twice counts with its last value, as in the document).
struct PolicyFieldValues {
  // The guard's texts, the prompt's before the messages': a completion's prompt (a string, or the
  // strings of a list), and the contents of the user's messages (role user, tool or function; a
  // role that is missing or not a string is the user's too): a string, or its parts' strings and
  // their objects' "text".
  std::vector<std::string> prompt_texts, message_texts;
  // The estimate's bytes: the prompt's strings and 3 a token id; per message (whatever its role)
  // 12 for its role's markers and its content string or its part objects' texts.
  std::size_t prompt_bytes = 0, message_bytes = 0;
  // Each where it is an integer from 0 to 2^63 - 1.
  std::optional<std::int64_t> max_completion_tokens, max_tokens;

  // A token per 3 bytes, at least 1 (gateway/tokens.h).
  std::int64_t estimated_prompt_tokens() const {
    return std::max<std::int64_t>(1, static_cast<std::int64_t>((prompt_bytes + message_bytes + 2) / 3));
  }
  // The answer's limit the request asks for: max_tokens, else max_completion_tokens.
  std::optional<std::int64_t> answer_limit() const { return max_tokens ? max_tokens : max_completion_tokens; }
};
PolicyFieldValues policy_fields(const nlohmann::json& body);

// Reads `body`'s routing fields into `out` and says whether it is JSON, exactly as
// nlohmann::json::sax_parse with RouteFields would (tested against it, also by a fuzzer): strict
// RFC 8259 with nlohmann's few liberties (a UTF-8 byte order mark first, a NUL byte taken for the
// end of the text), a number a double cannot hold refused, strings' UTF-8 and surrogates checked,
// and the same stop at the first refusal, with the same reasons. Nothing is built: nlohmann's
// lexer and its SAX events were a quarter of the gateway's instructions per plain request.
// With `policy`, the policies' fields go there as policy_fields() would read them from the
// document.
bool scan_route_fields(std::string_view body, RouteFieldValues& out, PolicyFieldValues* policy = nullptr);

// The routing fields read by nlohmann's SAX parser, with the document built into `document`
// when it is set, as nlohmann::json::parse would build it (a key given twice keeps its last
// value), for the policies that read the body; without it, scan_route_fields does the same for
// less.
class RouteFields : public nlohmann::json_sax<nlohmann::json>, public RouteFieldValues {
 public:
  explicit RouteFields(nlohmann::json* document = nullptr) : document_(document) {}

  bool null() override { return scalar() && value(nullptr); }
  bool boolean(bool v) override {
    if (depth_ == 1 && key_ == Key::kStream) stream = v;
    return scalar() && value(v);
  }
  bool number_integer(number_integer_t v) override { return scalar() && value(v); }
  bool number_unsigned(number_unsigned_t v) override { return scalar() && value(v); }
  bool number_float(number_float_t v, const string_t&) override { return scalar() && value(v); }
  bool string(string_t& v) override {
    if (depth_ == 1) {
      if (key_ == Key::kModel) model = v;
      else if (key_ == Key::kUser) user = v;
    }
    return value(std::move(v));
  }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    if (depth_ == 0) object = true;
    return nest() && open(nlohmann::json::object());
  }
  bool key(string_t& k) override {
    if (depth_ == 1) {
      key_ = k == std::string_view("model")    ? Key::kModel
             : k == std::string_view("user")   ? Key::kUser
             : k == std::string_view("stream") ? Key::kStream
                                               : Key::kOther;
      if (key_ == Key::kStream) stream = false;  // until its value says true
      if (key_ == Key::kModel && seen_model_) return refuse(kModelTwice);
      seen_model_ = seen_model_ || key_ == Key::kModel;
    }
    if (document_) member_ = &(*open_.back())[std::move(k)];
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return nest() && open(nlohmann::json::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  bool refuse(const char* why) {
    refusal = why;
    return false;
  }
  bool scalar() { return depth_ == 1 && key_ == Key::kModel ? refuse(kModelNotString) : true; }
  bool nest() {
    if (depth_ == 1 && key_ == Key::kModel) return refuse(kModelNotString);
    if (++depth_ > kMaxJsonDepth) return refuse(kTooDeep);
    return true;
  }
  // The document: `v` where the parse stands (the root, an array's next element, or the member
  // whose key came last); an object or array opened becomes where the next values go.
  nlohmann::json* place(nlohmann::json&& v) {
    if (open_.empty()) return &(*document_ = std::move(v));
    if (open_.back()->is_array()) return &open_.back()->emplace_back(std::move(v));
    return &(*member_ = std::move(v));
  }
  bool value(nlohmann::json&& v) {
    if (document_) place(std::move(v));
    return true;
  }
  bool open(nlohmann::json&& v) {
    if (document_) open_.push_back(place(std::move(v)));
    return true;
  }
  bool close() {
    --depth_;
    if (document_) open_.pop_back();
    return true;
  }
  int depth_ = 0;
  bool seen_model_ = false;
  enum class Key { kOther, kModel, kUser, kStream };
  Key key_ = Key::kOther;  // the top-level member being read
  nlohmann::json* document_;
  std::vector<nlohmann::json*> open_;
  nlohmann::json* member_ = nullptr;
};

}  // namespace lmserve::gateway
