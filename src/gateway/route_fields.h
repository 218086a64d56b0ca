// gateway/route_fields: what the gateway reads of a request body to route it, in one pass of
// nlohmann's SAX parser (RouteFields), optionally building the document at the same time.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_depth.h"

namespace lmserve::gateway {

// The top-level fields a request is routed by, read without building the document (a DOM of
// every request's body was a measurable share of the gateway's CPU per request) unless
// `document` is set: then the same pass builds it there too, as nlohmann::json::parse would (a
// key given twice keeps its last value), for the policies that read the body.
class RouteFields : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit RouteFields(nlohmann::json* document = nullptr) : document_(document) {}
  // Nesting beyond kMaxJsonDepth is refused (common/json_depth.h): serve refuses it too, and
  // whatever reads the body after the gateway need not be trusted with it.
  bool object = false;
  std::optional<std::string> model;
  std::string user;
  // Why the body is refused although it parses: "model" not a string, or given twice (two
  // readers of one body could route by one and serve the other), or nested too deep.
  const char* refusal = nullptr;

  bool null() override { return scalar() && value(nullptr); }
  bool boolean(bool v) override { return scalar() && value(v); }
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
      key_ = k == std::string_view("model") ? Key::kModel : k == std::string_view("user") ? Key::kUser : Key::kOther;
      if (key_ == Key::kModel && seen_model_) return refuse("'model' is given twice");
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
  bool scalar() { return depth_ == 1 && key_ == Key::kModel ? refuse("'model' must be a string") : true; }
  bool nest() {
    if (depth_ == 1 && key_ == Key::kModel) return refuse("'model' must be a string");
    if (++depth_ > kMaxJsonDepth) return refuse("the request body is nested too deeply");
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
  enum class Key { kOther, kModel, kUser };
  Key key_ = Key::kOther;  // the top-level member being read
  nlohmann::json* document_;
  std::vector<nlohmann::json*> open_;
  nlohmann::json* member_ = nullptr;
};

}  // namespace lmserve::gateway
