// Values of lmserve's Jinja interpreter, with Python's semantics where templates can see them
// (str(), repr(), truthiness, ==, <, json.dumps as transformers' tojson).
//
// Strings carry taint: byte ranges that came from the request (message content, tool
// arguments, ...). Concatenation keeps the ranges exact; any other string operation marks its
// whole result tainted if any input was. The chat layer turns taint into "no special tokens
// here" when encoding (text/tokenizer.h, TextSegment).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace lmserve::text::jinja {

struct Str {
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> tainted;  // sorted, disjoint [begin, end)

  bool any_taint() const { return !tainted.empty(); }
  void append(const Str& other);
  void append(std::string_view plain);
  void mark_all_tainted();
};

class Value;
using Array = std::vector<Value>;
struct Object;  // insertion-ordered map
class Interpreter;
struct CallArgs;
using NativeFn = std::function<Result<Value>(CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kCallable };

  Value() = default;  // undefined
  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(std::int64_t i);
  static Value number(double f);
  static Value string(std::string s, bool tainted = false);
  static Value string(Str s);
  static Value array(Array a = {});
  static Value object();
  static Value namespace_object();
  static Value callable(std::string name, NativeFn fn);
  // Converts JSON; every string in it is tainted when `tainted`.
  static Value from_json(const nlohmann::ordered_json& j, bool tainted);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_namespace() const { return kind_ == Kind::kObject && namespace_; }

  bool as_bool() const { return b_; }
  // A float outside int64's range saturates (NaN: 0): converting it was undefined behaviour (found by
  // template_fuzz under UBSan, e.g. center(6.07e20)); the callers' caps then refuse the extreme.
  std::int64_t as_int() const {
    if (kind_ != Kind::kFloat) return i_;
    if (!(f_ == f_)) return 0;
    if (f_ >= 9223372036854775807.0) return INT64_MAX;
    if (f_ <= -9223372036854775808.0) return INT64_MIN;
    return static_cast<std::int64_t>(f_);
  }
  double as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }
  const Str& str() const { return *s_; }
  Array& array_ref() const { return *a_; }
  Object& object_ref() const { return *o_; }
  const NativeFn& fn() const { return *fn_; }
  const std::string& name() const { return name_; }  // undefined: the missing name; callable: its name

  bool truthy() const;
  // Python str(): "None", "True", "1.0", "['a', 1]"; undefined is "".
  Str to_str() const;
  std::string repr() const;
  // json.dumps(x, ensure_ascii=False, indent=indent, separators=..., sort_keys=...) as a Python
  // object would serialise (indent < 0: None).
  Result<std::string> to_json(int indent, bool sort_keys) const;
  bool any_taint() const;
  std::string type_name() const;

  // Containers nest at most this deep in repr(), tojson and comparisons; a namespace can
  // hold itself ({% set ns.x = ns %}), and deeper nesting is treated as such a cycle.
  static constexpr int kMaxNesting = 256;  // Python's type name, for error messages
  // Lists share their elements, so a few statements build a list that holds one list
  // thousands of times over, itself holding another (found by template_fuzz): walking it
  // takes time exponential in the statements. repr() and tojson stop after this many bytes
  // (or a render's TextCap; the render's output limit then fails), any_taint() after this
  // many elements (answering "tainted", the safe side).
  static constexpr std::size_t kMaxTextBytes = 64u << 20;
  static constexpr std::size_t kMaxVisits = 1u << 22;
  // While one lives, repr() and tojson on this thread stop after `bytes` (at most
  // kMaxTextBytes) instead: a render sets its output limit + 1, past which it fails anyway.
  class TextCap {
   public:
    explicit TextCap(std::size_t bytes);
    ~TextCap();
    TextCap(const TextCap&) = delete;
    TextCap& operator=(const TextCap&) = delete;

   private:
    std::size_t previous_;
  };

 private:
  void repr_into(int depth, std::string& out) const;
  bool any_taint_at(int depth, std::size_t& visits) const;

  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  std::int64_t i_ = 0;
  double f_ = 0;
  bool namespace_ = false;
  std::shared_ptr<Str> s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
  std::shared_ptr<NativeFn> fn_;
  std::string name_;
};

struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value v);
};

bool values_equal(const Value& a, const Value& b);
// Python's <; InvalidArgument for types that do not order.
Result<bool> value_less(const Value& a, const Value& b);
// repr() of a Python float, e.g. 1.0, 0.1, 1e+16, inf.
std::string python_float(double f);

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
  // The positional argument `i`, else the named one, else `fallback`.
  Value get(std::size_t i, std::string_view name, Value fallback = Value()) const;
};

}  // namespace lmserve::text::jinja
