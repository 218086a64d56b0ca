// The evaluator behind Template::render (internal to text/jinja).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/template.h"

namespace lmserve::text::jinja {

using Frame = std::unordered_map<std::string, Value>;

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);
  // Empties every namespace made during rendering: {% set ns.x = ns %} makes a reference
  // cycle that shared ownership alone would never free.
  ~Interpreter();

  void define_global(const std::string& name, Value v) { (*frames_.front())[name] = std::move(v); }
  Status exec(const Body& body, Str& out);
  Result<Value> eval(const Expr& e);
  Status step();
  const RenderOptions& options() const { return options_; }

  // Builtins (builtins.cpp).
  Result<Value> apply_filter(const std::string& name, const Value& input, CallArgs& args);
  Result<bool> apply_test(const std::string& name, const Value& input, CallArgs& args);
  // `obj.name` when it names a method of obj's type: a bound callable; else nullopt.
  std::optional<Value> method(const Value& obj, const std::string& name);
  void install_globals();

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Status exec_node(const Node& n, Str& out);
  Status exec_for(const Node& n, Str& out);
  Status assign_targets(const std::vector<std::string>& targets, const Value& v, Frame& frame);
  Value lookup(const std::string& name) const;
  Result<Value> eval_binary(const Expr& e);
  Result<Value> eval_call(const Expr& e);
  Result<Value> get_attr(const Value& obj, const std::string& name, const Expr& at);
  Result<Value> get_item(const Value& obj, const Value& key, const Expr& at);
  Result<CallArgs> eval_args(const Expr& e, std::size_t first_arg);
  Value make_macro(const Node& n);
  Status append(Str& out, const Str& s);

  const RenderOptions& options_;
  std::vector<std::shared_ptr<Frame>> frames_;
  Flow flow_ = Flow::kNormal;
  std::size_t steps_ = 0;
  std::size_t output_ = 0;
  int call_depth_ = 0;
  std::vector<Value> namespaces_;
};

// Shared helpers for builtins.
Status type_error(const std::string& msg);
Status undefined_error(const Value& v);
// Iterates like Python's iter(): list items, dict keys, string characters; undefined is empty.
Result<Array> iterate(const Value& v);
// Python's str.split() whitespace (str.isspace()).
bool py_isspace(char32_t c);
std::vector<std::string> utf8_chars(const std::string& s);

}  // namespace lmserve::text::jinja
