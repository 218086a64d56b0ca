// Filters, tests, methods and globals of the Jinja interpreter.
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>

#include "text/jinja/interpreter.h"
#include "text/utf8.h"

namespace lmserve::text::jinja {

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

Value str_result(std::string s, const Value& from) { return Value::string(std::move(s), from.any_taint()); }

std::vector<char32_t> code_points(const std::string& s) {
  std::vector<char32_t> out;
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp = kReplacementChar;
    int n = utf8_decode(s, i, &cp);
    out.push_back(cp);
    i += n == 0 ? 1 : n;
  }
  return out;
}

std::string from_code_points(const std::vector<char32_t>& cps) {
  std::string out;
  for (char32_t c : cps) utf8_append(out, c);
  return out;
}

std::string map_case(const std::string& s, bool upper) {
  auto cps = code_points(s);
  for (auto& c : cps) {
    c = static_cast<char32_t>(upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c))
                                    : utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
  }
  return from_code_points(cps);
}

bool is_cased_letter(char32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

std::string title_case(const std::string& s) {  // Python str.title()
  auto cps = code_points(s);
  bool prev_cased = false;
  for (auto& c : cps) {
    bool cased = is_cased_letter(c);
    if (cased) c = static_cast<char32_t>(prev_cased ? utf8proc_tolower(static_cast<utf8proc_int32_t>(c))
                                                    : utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
    prev_cased = cased;
  }
  return from_code_points(cps);
}

std::string capitalize(const std::string& s) {
  auto cps = code_points(s);
  for (std::size_t i = 0; i < cps.size(); ++i) {
    cps[i] = static_cast<char32_t>(i == 0 ? utf8proc_toupper(static_cast<utf8proc_int32_t>(cps[i]))
                                          : utf8proc_tolower(static_cast<utf8proc_int32_t>(cps[i])));
  }
  return from_code_points(cps);
}

// Python str.strip/lstrip/rstrip with optional `chars`.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto cps = code_points(s);
  std::vector<char32_t> set;
  bool ws = chars.is_undefined() || chars.is_none();
  if (!ws) set = code_points(chars.to_str().text);
  auto strip_it = [&](char32_t c) { return ws ? py_isspace(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  std::size_t b = 0, e = cps.size();
  while (left && b < e && strip_it(cps[b])) ++b;
  while (right && e > b && strip_it(cps[e - 1])) --e;
  return from_code_points(std::vector<char32_t>(cps.begin() + static_cast<std::ptrdiff_t>(b), cps.begin() + static_cast<std::ptrdiff_t>(e)));
}

Array split(const Value& self, const Value& sep_v, std::int64_t maxsplit) {
  const std::string& s = self.str().text;
  bool taint = self.any_taint();
  Array out;
  if (sep_v.is_undefined() || sep_v.is_none()) {  // runs of whitespace, no empty strings
    auto cps = code_points(s);
    std::size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && py_isspace(cps[i])) ++i;
      if (i >= cps.size()) break;
      std::size_t j = i;
      if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit) {
        std::size_t e = cps.size();
        while (e > j && py_isspace(cps[e - 1])) --e;
        out.push_back(Value::string(from_code_points({cps.begin() + static_cast<std::ptrdiff_t>(j), cps.begin() + static_cast<std::ptrdiff_t>(e)}), taint));
        break;
      }
      while (j < cps.size() && !py_isspace(cps[j])) ++j;
      out.push_back(Value::string(from_code_points({cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j)}), taint));
      i = j;
    }
    return out;
  }
  std::string sep = sep_v.to_str().text;
  std::size_t pos = 0;
  while (true) {
    std::size_t at = sep.empty() ? std::string::npos : s.find(sep, pos);
    if (at == std::string::npos || (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit)) {
      out.push_back(Value::string(s.substr(pos), taint));
      return out;
    }
    out.push_back(Value::string(s.substr(pos, at - pos), taint));
    pos = at + sep.size();
  }
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, std::int64_t count) {
  if (from.empty()) {  // Python inserts `to` between every character
    auto chars = utf8_chars(s);
    std::string out;
    std::int64_t n = 0;
    for (std::size_t i = 0; i <= chars.size(); ++i) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (i < chars.size()) out += chars[i];
    }
    return out;
  }
  std::string out;
  std::size_t pos = 0;
  std::int64_t n = 0;
  for (std::size_t at; (count < 0 || n < count) && (at = s.find(from, pos)) != std::string::npos; ++n) {
    out.append(s, pos, at - pos);
    out += to;
    pos = at + from.size();
  }
  out.append(s, pos);
  return out;
}

Status unsafe(const std::string& attr, const Value& obj) {
  return Status(StatusCode::kInvalidArgument,
                "SecurityError: access to attribute '" + attr + "' of '" + obj.type_name() + "' object is unsafe.");
}

Result<std::int64_t> length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<std::int64_t>(utf8_length(v.str().text));
    case Value::Kind::kArray: return static_cast<std::int64_t>(v.array_ref().size());
    case Value::Kind::kObject: return static_cast<std::int64_t>(v.object_ref().items.size());
    default: return error(type_error("object of type '" + v.type_name() + "' has no len()"));
  }
}

Value attribute_of(const Value& item, const std::string& path) {
  Value cur = item;
  std::size_t pos = 0;
  while (pos <= path.size()) {
    std::size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (cur.is_object()) {
      const Value* v = cur.object_ref().find(part);
      cur = v ? *v : Value::undefined(part);
    } else if (cur.is_array() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      std::size_t i = std::stoul(part);
      cur = i < cur.array_ref().size() ? cur.array_ref()[i] : Value::undefined(part);
    } else {
      cur = Value::undefined(part);
    }
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Python's str.format for "{}", "{0}" and "{name}" fields (no format specs).
Result<Value> py_format(const Value& self, CallArgs& args) {
  const std::string& f = self.str().text;
  Str out;
  std::size_t auto_index = 0;
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '{' && i + 1 < f.size() && f[i + 1] == '{') {
      out.append("{");
      ++i;
    } else if (f[i] == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out.append("}");
      ++i;
    } else if (f[i] == '{') {
      std::size_t close = f.find('}', i);
      if (close == std::string::npos) return error(StatusCode::kInvalidArgument, "ValueError: unmatched '{' in format string");
      std::string field = f.substr(i + 1, close - i - 1);
      Value v;
      if (field.empty()) {
        v = args.get(auto_index++, "\x01");
      } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
        v = args.get(std::stoul(field), "\x01");
      } else {
        v = args.get(static_cast<std::size_t>(-1), field);
      }
      if (v.is_undefined()) return error(StatusCode::kInvalidArgument, "IndexError: format field '" + field + "' has no value");
      out.append(v.to_str());
      i = close;
    } else {
      out.append(std::string_view(&f[i], 1));
    }
  }
  if (self.any_taint()) out.mark_all_tainted();
  return Value::string(std::move(out));
}

Result<Value> to_integer(const Value& v, const Value& fallback) {
  if (v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool) return Value::integer(v.as_int());
  if (v.kind() == Value::Kind::kFloat) return Value::integer(static_cast<std::int64_t>(v.as_double()));
  if (v.is_string()) {
    std::string s = strip(v.str().text, Value(), true, true);
    char* end = nullptr;
    long long x = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::integer(x);
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::integer(static_cast<std::int64_t>(d));
  }
  return fallback;
}

}  // namespace

std::optional<Value> Interpreter::method(const Value& obj, const std::string& name) {
  auto bind = [&](NativeFn fn) { return std::optional<Value>(Value::callable(name, std::move(fn))); };
  if (obj.is_string()) {
    Value self = obj;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      bool l = name != "rstrip", r = name != "lstrip";
      return bind([self, l, r](CallArgs& a) -> Result<Value> {
        return str_result(strip(self.str().text, a.get(0, "chars"), l, r), self);
      });
    }
    if (name == "split") {
      return bind([self](CallArgs& a) -> Result<Value> {
        Value m = a.get(1, "maxsplit", Value::integer(-1));
        return Value::array(split(self, a.get(0, "sep"), m.as_int()));
      });
    }
    if (name == "startswith" || name == "endswith") {
      bool starts = name == "startswith";
      return bind([self, starts](CallArgs& a) -> Result<Value> {
        Value p = a.get(0, "prefix");
        std::vector<std::string> options;
        if (p.is_array()) {
          for (const auto& x : p.array_ref()) options.push_back(x.to_str().text);
        } else if (p.is_string()) {
          options.push_back(p.str().text);
        } else {
          return error(type_error(std::string(starts ? "startswith" : "endswith") + " first arg must be str or a tuple of str"));
        }
        const std::string& s = self.str().text;
        for (const auto& o : options) {
          if (starts ? s.starts_with(o) : s.ends_with(o)) return Value::boolean(true);
        }
        return Value::boolean(false);
      });
    }
    if (name == "upper" || name == "lower") {
      bool up = name == "upper";
      return bind([self, up](CallArgs&) -> Result<Value> { return str_result(map_case(self.str().text, up), self); });
    }
    if (name == "title") return bind([self](CallArgs&) -> Result<Value> { return str_result(title_case(self.str().text), self); });
    if (name == "capitalize") {
      return bind([self](CallArgs&) -> Result<Value> { return str_result(capitalize(self.str().text), self); });
    }
    if (name == "replace") {
      return bind([self](CallArgs& a) -> Result<Value> {
        Value count = a.get(2, "count", Value::integer(-1));
        bool taint = self.any_taint() || a.get(1, "new").any_taint();
        return Value::string(replace_all(self.str().text, a.get(0, "old").to_str().text, a.get(1, "new").to_str().text,
                                         count.as_int()),
                             taint);
      });
    }
    if (name == "find" || name == "rfind" || name == "count" || name == "index") {
      std::string m = name;
      return bind([self, m](CallArgs& a) -> Result<Value> {
        std::string sub = a.get(0, "sub").to_str().text;
        const std::string& s = self.str().text;
        if (m == "count") {
          if (sub.empty()) return Value::integer(static_cast<std::int64_t>(utf8_length(s)) + 1);
          std::int64_t n = 0;
          for (std::size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
          return Value::integer(n);
        }
        std::size_t at = m == "rfind" ? s.rfind(sub) : s.find(sub);
        if (at == std::string::npos) {
          if (m == "index") return error(StatusCode::kInvalidArgument, "ValueError: substring not found");
          return Value::integer(-1);
        }
        return Value::integer(static_cast<std::int64_t>(utf8_length(s.substr(0, at))));
      });
    }
    if (name == "join") {
      return bind([self](CallArgs& a) -> Result<Value> {
        auto items = iterate(a.get(0, "iterable"));
        if (!items) return error(items.error());
        Str out;
        for (std::size_t i = 0; i < items->size(); ++i) {
          if (i) out.append(self.str());
          out.append((*items)[i].to_str());
        }
        return Value::string(std::move(out));
      });
    }
    if (name == "format") return bind([self](CallArgs& a) { return py_format(self, a); });
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "islower" ||
        name == "isupper") {
      std::string m = name;
      return bind([self, m](CallArgs&) -> Result<Value> {
        auto cps = code_points(self.str().text);
        if (cps.empty()) return Value::boolean(false);
        bool all = true, any_cased = false;
        for (char32_t c : cps) {
          auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
          bool alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
          bool digit = cat == UTF8PROC_CATEGORY_ND;
          if (m == "isdigit") all = all && digit;
          if (m == "isalpha") all = all && alpha;
          if (m == "isspace") all = all && py_isspace(c);
          if (m == "isalnum") all = all && (alpha || digit || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO);
          if (m == "islower" || m == "isupper") {
            if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) {
              any_cased = true;
              all = all && m == "isupper";
            } else if (cat == UTF8PROC_CATEGORY_LL) {
              any_cased = true;
              all = all && m == "islower";
            }
          }
        }
        if (m == "islower" || m == "isupper") all = all && any_cased;
        return Value::boolean(all);
      });
    }
    return std::nullopt;
  }
  if (obj.is_object() && !obj.is_namespace()) {
    Value self = obj;
    if (name == "items") {
      return bind([self](CallArgs&) -> Result<Value> {
        Array out;
        for (const auto& [k, v] : self.object_ref().items) out.push_back(Value::array({Value::string(k), v}));
        return Value::array(std::move(out));
      });
    }
    if (name == "keys" || name == "values") {
      bool keys = name == "keys";
      return bind([self, keys](CallArgs&) -> Result<Value> {
        Array out;
        for (const auto& [k, v] : self.object_ref().items) out.push_back(keys ? Value::string(k) : v);
        return Value::array(std::move(out));
      });
    }
    if (name == "get") {
      return bind([self](CallArgs& a) -> Result<Value> {
        Value key = a.get(0, "key");
        if (key.is_string()) {
          if (const Value* v = self.object_ref().find(key.str().text)) return *v;
        }
        return a.get(1, "default", Value::none());
      });
    }
    if (name == "update" || name == "pop" || name == "setdefault" || name == "clear" || name == "popitem") {
      std::string m = name;
      return bind([self, m](CallArgs&) -> Result<Value> { return error(unsafe(m, self)); });
    }
    return std::nullopt;
  }
  if (obj.is_array()) {
    Value self = obj;
    if (name == "append" || name == "extend" || name == "pop" || name == "insert" || name == "remove" ||
        name == "clear" || name == "sort" || name == "reverse") {
      std::string m = name;
      return bind([self, m](CallArgs&) -> Result<Value> { return error(unsafe(m, self)); });
    }
    if (name == "index" || name == "count") {
      bool count = name == "count";
      return bind([self, count](CallArgs& a) -> Result<Value> {
        Value x = a.get(0, "value");
        std::int64_t n = 0;
        const auto& arr = self.array_ref();
        for (std::size_t i = 0; i < arr.size(); ++i) {
          if (!values_equal(arr[i], x)) continue;
          if (!count) return Value::integer(static_cast<std::int64_t>(i));
          ++n;
        }
        if (!count) return error(StatusCode::kInvalidArgument, "ValueError: " + x.repr() + " is not in list");
        return Value::integer(n);
      });
    }
  }
  return std::nullopt;
}

Result<bool> Interpreter::apply_test(const std::string& name, const Value& v, CallArgs& args) {
  using K = Value::Kind;
  Value arg = args.get(0, "other");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "true") return v.kind() == K::kBool && v.as_bool();
  if (name == "false") return v.kind() == K::kBool && !v.as_bool();
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "number") return v.is_number() || v.kind() == K::kBool;
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object() && !v.is_namespace();
  if (name == "iterable") return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "sameas") {
    if (v.kind() != arg.kind()) return false;
    if (v.is_array() || v.is_object()) return &v.array_ref() == &arg.array_ref();
    return values_equal(v, arg);
  }
  if (name == "in") {
    if (arg.is_string()) return v.is_string() && arg.str().text.find(v.str().text) != std::string::npos;
    if (arg.is_object()) return v.is_string() && arg.object_ref().find(v.str().text) != nullptr;
    auto items = iterate(arg);
    if (!items) return error(items.error());
    return std::any_of(items->begin(), items->end(), [&](const Value& x) { return values_equal(x, v); });
  }
  if (name == "eq" || name == "equalto" || name == "==") return values_equal(v, arg);
  if (name == "ne" || name == "!=") return !values_equal(v, arg);
  if (name == "lt" || name == "lessthan" || name == "<") return value_less(v, arg);
  if (name == "gt" || name == "greaterthan" || name == ">") return value_less(arg, v);
  if (name == "le" || name == "<=") {
    auto r = value_less(arg, v);
    if (!r) return r;
    return !*r;
  }
  if (name == "ge" || name == ">=") {
    auto r = value_less(v, arg);
    if (!r) return r;
    return !*r;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind() != K::kInt && v.kind() != K::kBool) return error(type_error("test '" + name + "' needs an integer"));
    std::int64_t x = v.as_int();
    if (name == "odd") return x % 2 != 0;
    if (name == "even") return x % 2 == 0;
    std::int64_t d = arg.as_int();
    if (d == 0) return error(StatusCode::kInvalidArgument, "ZeroDivisionError: integer division or modulo by zero");
    return x % d == 0;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    const std::string& s = v.str().text;
    return s == map_case(s, name == "upper");
  }
  return error(StatusCode::kInvalidArgument, "TemplateRuntimeError: no test named '" + name + "'");
}

Result<Value> Interpreter::apply_filter(const std::string& name, const Value& v, CallArgs& args) {
  using K = Value::Kind;
  if (name == "length" || name == "count") {
    auto n = length_of(v);
    if (!n) return error(n.error());
    return Value::integer(*n);
  }
  if (name == "string") return Value::string(v.to_str());
  if (name == "safe") return v.is_string() ? v : Value::string(v.to_str());
  if (name == "escape" || name == "e") return str_result(html_escape(v.to_str().text), v);
  if (name == "trim") return str_result(strip(v.to_str().text, args.get(0, "chars"), true, true), v);
  if (name == "upper" || name == "lower") return str_result(map_case(v.to_str().text, name == "upper"), v);
  if (name == "title") return str_result(title_case(v.to_str().text), v);
  if (name == "capitalize") return str_result(capitalize(v.to_str().text), v);
  if (name == "replace") {
    Value count = args.get(2, "count", Value::integer(-1));
    if (count.is_none()) count = Value::integer(-1);
    return Value::string(replace_all(v.to_str().text, args.get(0, "old").to_str().text,
                                     args.get(1, "new").to_str().text, count.as_int()),
                         v.any_taint() || args.get(1, "new").any_taint());
  }
  if (name == "tojson") {
    Value indent = args.get(0, "indent", Value::none());
    Value sort_keys = args.get(3, "sort_keys", Value::boolean(false));
    // An indent past int's range cannot fit the output cap anyway (json_value checks the rest).
    if (indent.is_number() && indent.as_int() > std::numeric_limits<int>::max()) {
      return error(Status(StatusCode::kResourceExhausted, "tojson output too large"));
    }
    auto j = v.to_json(indent.is_number() ? static_cast<int>(indent.as_int()) : -1, sort_keys.truthy());
    if (!j && j.error().code() == StatusCode::kResourceExhausted) return error(j.error());
    if (!j) return error(Status(StatusCode::kInvalidArgument, "TypeError: " + j.error().message()));
    return Value::string(std::move(*j), v.any_taint());
  }
  if (name == "default" || name == "d") {
    Value fallback = args.get(0, "default_value", Value::string(""));
    bool boolean = args.get(1, "boolean", Value::boolean(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return fallback;
    return v;
  }
  if (name == "list") {
    auto items = iterate(v);
    if (!items) return error(items.error());
    return Value::array(std::move(*items));
  }
  if (name == "first" || name == "last") {
    auto items = iterate(v);
    if (!items) return error(items.error());
    if (items->empty()) return Value::undefined(name);
    return name == "first" ? items->front() : items->back();
  }
  if (name == "join") {
    auto items = iterate(v);
    if (!items) return error(items.error());
    Value sep = args.get(0, "d", Value::string(""));
    Value attr = args.get(1, "attribute");
    Str out;
    for (std::size_t i = 0; i < items->size(); ++i) {
      if (i) out.append(sep.to_str());
      Value item = attr.is_undefined() || attr.is_none() ? (*items)[i] : attribute_of((*items)[i], attr.to_str().text);
      out.append(item.to_str());
    }
    return Value::string(std::move(out));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::array();
    if (!v.is_object()) return error(type_error("'" + v.type_name() + "' object has no attribute 'items'"));
    Array out;
    for (const auto& [k, x] : v.object_ref().items) out.push_back(Value::array({Value::string(k), x}));
    return Value::array(std::move(out));
  }
  if (name == "dictsort") {
    if (!v.is_object()) return error(type_error("dictsort needs a dict"));
    auto items = v.object_ref().items;
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return map_case(a.first, false) < map_case(b.first, false); });
    Array out;
    for (const auto& [k, x] : items) out.push_back(Value::array({Value::string(k), x}));
    return Value::array(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    bool by_attr = name.ends_with("attr");
    bool keep_if = name.starts_with("select");
    auto items = iterate(v);
    if (!items) return error(items.error());
    std::string attr = by_attr ? args.get(0, "attr").to_str().text : "";
    std::size_t test_pos = by_attr ? 1 : 0;
    Value test = args.get(test_pos, "\x01");
    CallArgs test_args;
    for (std::size_t i = test_pos + 1; i < args.positional.size(); ++i) test_args.positional.push_back(args.positional[i]);
    Array out;
    for (const auto& item : *items) {
      Value probe = by_attr ? attribute_of(item, attr) : item;
      bool pass;
      if (test.is_undefined()) {
        pass = probe.truthy();
      } else {
        auto r = apply_test(test.to_str().text, probe, test_args);
        if (!r) return error(r.error());
        pass = *r;
      }
      if (pass == keep_if) out.push_back(item);
    }
    return Value::array(std::move(out));
  }
  if (name == "map") {
    auto items = iterate(v);
    if (!items) return error(items.error());
    Array out;
    Value attr = args.get(static_cast<std::size_t>(-1), "attribute");
    if (!attr.is_undefined()) {
      Value def = args.get(static_cast<std::size_t>(-1), "default");
      for (const auto& item : *items) {
        Value x = attribute_of(item, attr.to_str().text);
        out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
      }
      return Value::array(std::move(out));
    }
    if (args.positional.empty()) return error(type_error("map requires a filter name or attribute"));
    std::string filter = args.positional[0].to_str().text;
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.named = args.named;
    for (const auto& item : *items) {
      auto x = apply_filter(filter, item, rest);
      if (!x) return x;
      out.push_back(std::move(*x));
    }
    return Value::array(std::move(out));
  }
  if (name == "indent") {
    Value width = args.get(0, "width", Value::integer(4));
    bool first = args.get(1, "first", Value::boolean(false)).truthy();
    bool blank = args.get(2, "blank", Value::boolean(false)).truthy();
    const std::int64_t pad = width.is_string() ? 0 : std::max<std::int64_t>(0, width.as_int());
    std::string s = v.to_str().text + "\n";
    // Every line gets the indentation: refuse what could not fit the output cap before building it.
    const auto line_count = static_cast<std::uint64_t>(std::count(s.begin(), s.end(), '\n') + std::count(s.begin(), s.end(), '\r'));
    const std::uint64_t ind_bytes = width.is_string() ? width.str().text.size() : static_cast<std::uint64_t>(pad);
    if (ind_bytes > Value::kMaxTextBytes || ind_bytes * line_count + s.size() > Value::kMaxTextBytes) {
      return error(Status(StatusCode::kResourceExhausted, "indent: output too large"));
    }
    std::string ind = width.is_string() ? width.str().text : std::string(static_cast<std::size_t>(pad), ' ');
    std::vector<std::string> lines;
    std::size_t pos = 0;
    while (pos < s.size()) {
      std::size_t nl = s.find_first_of("\n\r", pos);
      lines.push_back(s.substr(pos, nl - pos));
      pos = (s[nl] == '\r' && nl + 1 < s.size() && s[nl + 1] == '\n') ? nl + 2 : nl + 1;
    }
    std::string out;
    if (blank) {
      for (std::size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + ind : "") + lines[i];
    } else {
      out = lines.empty() ? "" : lines[0];
      for (std::size_t i = 1; i < lines.size(); ++i) out += "\n" + (lines[i].empty() ? "" : ind) + lines[i];
    }
    if (first) out = ind + out;
    return str_result(out, v);
  }
  if (name == "int") return to_integer(v, args.get(0, "default", Value::integer(0)));
  if (name == "float") {
    if (v.is_number() || v.kind() == K::kBool) return Value::number(v.as_double());
    if (v.is_string()) {
      std::string s = strip(v.str().text, Value(), true, true);
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value::number(d);
    }
    return args.get(0, "default", Value::number(0.0));
  }
  if (name == "abs") {
    if (v.kind() == K::kFloat) return Value::number(std::fabs(v.as_double()));
    if (v.kind() == K::kInt || v.kind() == K::kBool) return Value::integer(std::llabs(v.as_int()));
    return error(type_error("bad operand type for abs(): '" + v.type_name() + "'"));
  }
  if (name == "round") {
    std::int64_t precision = args.get(0, "precision", Value::integer(0)).as_int();
    std::string method = args.get(1, "method", Value::string("common")).to_str().text;
    double scale = std::pow(10.0, static_cast<double>(precision));
    double x = v.as_double() * scale;
    x = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
    return Value::number(x / scale);
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto chars = utf8_chars(v.str().text);
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
      return str_result(out, v);
    }
    auto items = iterate(v);
    if (!items) return error(items.error());
    std::reverse(items->begin(), items->end());
    return Value::array(std::move(*items));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max" || name == "sum") {
    auto items = iterate(v);
    if (!items) return error(items.error());
    if (name == "sum") {
      Value total = args.get(1, "start", Value::integer(0));
      Value attr = args.get(0, "attribute");
      for (const auto& item : *items) {
        Value x = attr.is_undefined() ? item : attribute_of(item, attr.to_str().text);
        if (!(x.is_number() || x.kind() == K::kBool)) return error(type_error("unsupported operand type(s) for +"));
        bool fl = total.kind() == K::kFloat || x.kind() == K::kFloat;
        total = fl ? Value::number(total.as_double() + x.as_double()) : Value::integer(total.as_int() + x.as_int());
      }
      return total;
    }
    bool reverse = name == "sort" && args.get(0, "reverse", Value::boolean(false)).truthy();
    Value attr = args.get(name == "sort" ? 2 : 1, "attribute");
    auto key = [&](const Value& x) { return attr.is_undefined() ? x : attribute_of(x, attr.to_str().text); };
    Status failure;
    std::stable_sort(items->begin(), items->end(), [&](const Value& a, const Value& b) {
      auto lt = value_less(key(a), key(b));
      if (!lt) {
        failure = lt.error();
        return false;
      }
      return *lt;
    });
    if (!failure.is_ok()) return error(failure);
    if (reverse) std::reverse(items->begin(), items->end());
    if (name == "sort") return Value::array(std::move(*items));
    if (name == "unique") {
      Array out;
      for (const auto& x : *items) {
        if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return values_equal(x, y); })) out.push_back(x);
      }
      return Value::array(std::move(out));
    }
    if (items->empty()) return Value::undefined(name);
    return name == "min" ? items->front() : items->back();
  }
  if (name == "wordcount") return Value::integer(static_cast<std::int64_t>(split(Value::string(v.to_str()), Value(), -1).size()));
  if (name == "center") {
    std::int64_t width = args.get(0, "width", Value::integer(80)).as_int();
    std::string s = v.to_str().text;
    auto len = static_cast<std::int64_t>(utf8_length(s));
    if (width <= len) return str_result(s, v);
    if (static_cast<std::uint64_t>(width - len) + s.size() > Value::kMaxTextBytes) {
      return error(Status(StatusCode::kResourceExhausted, "center: output too large"));
    }
    std::int64_t total = width - len, left = total / 2 + (total & width & 1);
    return str_result(std::string(static_cast<std::size_t>(left), ' ') + s +
                          std::string(static_cast<std::size_t>(total - left), ' '),
                      v);
  }
  return error(StatusCode::kInvalidArgument, "TemplateRuntimeError: no filter named '" + name + "'");
}

void Interpreter::install_globals() {
  define_global("range", Value::callable("range", [this](CallArgs& a) -> Result<Value> {
    std::int64_t start = 0, stop, stride = 1;
    if (a.positional.size() == 1) {
      stop = a.positional[0].as_int();
    } else if (a.positional.size() >= 2) {
      start = a.positional[0].as_int();
      stop = a.positional[1].as_int();
      if (a.positional.size() >= 3) stride = a.positional[2].as_int();
    } else {
      return error(type_error("range expected at least 1 argument, got 0"));
    }
    if (stride == 0) return error(StatusCode::kInvalidArgument, "ValueError: range() arg 3 must not be zero");
    Array out;
    for (std::int64_t i = start; stride > 0 ? i < stop : i > stop; i += stride) {
      LMSERVE_RETURN_IF_ERROR(step());
      out.push_back(Value::integer(i));
    }
    return Value::array(std::move(out));
  }));
  define_global("namespace", Value::callable("namespace", [this](CallArgs& a) -> Result<Value> {
    Value ns = Value::namespace_object();
    namespaces_.push_back(ns);
    for (const auto& p : a.positional) {
      if (p.is_object()) {
        for (const auto& [k, v] : p.object_ref().items) ns.object_ref().set(k, v);
      }
    }
    for (const auto& [k, v] : a.named) ns.object_ref().set(k, v);
    return ns;
  }));
  define_global("dict", Value::callable("dict", [](CallArgs& a) -> Result<Value> {
    Value d = Value::object();
    for (const auto& [k, v] : a.named) d.object_ref().set(k, v);
    return d;
  }));
  define_global("raise_exception", Value::callable("raise_exception", [](CallArgs& a) -> Result<Value> {
    return error(StatusCode::kInvalidArgument, "raise_exception: " + a.get(0, "message").to_str().text);
  }));
  define_global("strftime_now", Value::callable("strftime_now", [this](CallArgs& a) -> Result<Value> {
    std::string fmt = a.get(0, "format").to_str().text;
    std::time_t t = std::chrono::system_clock::to_time_t(options().now());
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    std::size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value::string(std::string(buf, n));
  }));
}

}  // namespace lmserve::text::jinja
