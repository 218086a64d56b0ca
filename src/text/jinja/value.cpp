#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace lmserve::text::jinja {

namespace {
// repr() and tojson stop after this many bytes on this thread (Value::TextCap).
thread_local std::size_t text_cap = Value::kMaxTextBytes;
}  // namespace

void Str::append(const Str& other) {
  std::size_t base = text.size();
  for (auto [b, e] : other.tainted) {
    if (!tainted.empty() && tainted.back().second == base + b) {
      tainted.back().second = base + e;
    } else {
      tainted.emplace_back(base + b, base + e);
    }
  }
  text += other.text;
}

void Str::append(std::string_view plain) { text += plain; }

void Str::mark_all_tainted() {
  tainted.clear();
  if (!text.empty()) tainted.emplace_back(0, text.size());
}

Value Value::undefined(std::string name) {
  Value v;
  v.name_ = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  v.i_ = b ? 1 : 0;
  return v;
}
Value Value::integer(std::int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::string(std::string s, bool tainted) {
  Str st{std::move(s), {}};
  if (tainted) st.mark_all_tainted();
  return string(std::move(st));
}
Value Value::string(Str s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<Str>(std::move(s));
  return v;
}
Value Value::array(Array a) {
  Value v;
  v.kind_ = Kind::kArray;
  v.a_ = std::make_shared<Array>(std::move(a));
  return v;
}
Value Value::object() {
  Value v;
  v.kind_ = Kind::kObject;
  v.o_ = std::make_shared<Object>();
  return v;
}
Value Value::namespace_object() {
  Value v = object();
  v.namespace_ = true;
  return v;
}
Value Value::callable(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.name_ = std::move(name);
  v.fn_ = std::make_shared<NativeFn>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j, bool tainted) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return integer(static_cast<std::int64_t>(j.get<std::uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>(), tainted);
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json(e, tainted));
      return array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value o = object();
      for (auto it = j.begin(); it != j.end(); ++it) o.object_ref().set(it.key(), from_json(it.value(), tainted));
      return o;
    }
    default: return none();
  }
}

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}
Value* Object::find(std::string_view key) {
  for (auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}
void Object::set(std::string key, Value v) {
  if (Value* existing = find(key)) {
    *existing = std::move(v);
  } else {
    items.emplace_back(std::move(key), std::move(v));
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0.0;
    case Kind::kString: return !s_->text.empty();
    case Kind::kArray: return !a_->empty();
    case Kind::kObject: return namespace_ || !o_->items.empty();
    case Kind::kCallable: return true;
  }
  return false;
}

std::string python_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // "-1.2345e+06": shortest round-trip digits
  bool neg = sci[0] == '-';
  std::string body = neg ? sci.substr(1) : sci;
  auto epos = body.find('e');
  std::string mant = body.substr(0, epos);
  int exp = std::stoi(body.substr(epos + 1));
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -5 + 1 && exp < 16) {  // Python repr: fixed notation for 1e-4 <= |f| < 1e16
    if (exp >= 0) {
      std::string ip = digits.size() > static_cast<std::size_t>(exp) ? digits.substr(0, exp + 1)
                                                                     : digits + std::string(exp + 1 - digits.size(), '0');
      std::string fp = digits.size() > static_cast<std::size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      out = ip + "." + fp;
    } else {
      out = "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return neg ? "-" + out : out;
}

namespace {

std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

Status json_value(const Value& v, int indent, bool sort_keys, int level, std::string& out) {
  if (level > Value::kMaxNesting) return Status(StatusCode::kInvalidArgument, "Circular reference detected");
  if (out.size() > text_cap) return Status(StatusCode::kResourceExhausted, "tojson output too large");
  // A line break and its indentation, which alone may pass the cap: tojson(indent=1111390033)
  // appended a gigabyte of spaces before the next check (found by template_fuzz).
  auto newline = [&](int lvl) -> Status {
    if (indent < 0) return Status::ok();
    const std::size_t pad = static_cast<std::size_t>(indent) * static_cast<std::size_t>(lvl);
    if (pad > text_cap || out.size() + 1 + pad > text_cap) return Status(StatusCode::kResourceExhausted, "tojson output too large");
    out += '\n';
    out.append(pad, ' ');
    return Status::ok();
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return Status::ok();
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return Status::ok();
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return Status::ok();
    case Value::Kind::kFloat: {
      double f = v.as_double();
      out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity") : python_float(f);
      return Status::ok();
    }
    case Value::Kind::kString: json_string(v.str().text, out); return Status::ok();
    case Value::Kind::kArray: {
      const auto& a = v.array_ref();
      if (a.empty()) {
        out += "[]";
        return Status::ok();
      }
      out += '[';
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (i) out += item_sep;
        LMSERVE_RETURN_IF_ERROR(newline(level + 1));
        LMSERVE_RETURN_IF_ERROR(json_value(a[i], indent, sort_keys, level + 1, out));
      }
      LMSERVE_RETURN_IF_ERROR(newline(level));
      out += ']';
      return Status::ok();
    }
    case Value::Kind::kObject: {
      if (v.is_namespace()) {
        return Status(StatusCode::kInvalidArgument, "Object of type Namespace is not JSON serializable");
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.object_ref().items) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return Status::ok();
      }
      if (sort_keys) std::sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        LMSERVE_RETURN_IF_ERROR(newline(level + 1));
        json_string(items[i]->first, out);
        out += ": ";
        LMSERVE_RETURN_IF_ERROR(json_value(items[i]->second, indent, sort_keys, level + 1, out));
      }
      LMSERVE_RETURN_IF_ERROR(newline(level));
      out += '}';
      return Status::ok();
    }
    case Value::Kind::kUndefined:
    case Value::Kind::kCallable:
      return Status(StatusCode::kInvalidArgument, "Object of type " + v.type_name() + " is not JSON serializable");
  }
  return Status::ok();
}

}  // namespace

Str Value::to_str() const {
  switch (kind_) {
    case Kind::kUndefined: return {};
    case Kind::kString: return *s_;
    case Kind::kNone: return {"None", {}};
    case Kind::kBool: return {b_ ? "True" : "False", {}};
    case Kind::kInt: return {std::to_string(i_), {}};
    case Kind::kFloat: return {python_float(f_), {}};
    default: {
      Str s{repr(), {}};
      if (any_taint()) s.mark_all_tainted();
      return s;
    }
  }
}

Value::TextCap::TextCap(std::size_t bytes) : previous_(text_cap) { text_cap = std::min(bytes, kMaxTextBytes); }
Value::TextCap::~TextCap() { text_cap = previous_; }

std::string Value::repr() const {
  std::string out;
  repr_into(0, out);
  return out;
}

void Value::repr_into(int depth, std::string& out) const {
  if (out.size() > text_cap) return;  // see kMaxTextBytes
  switch (kind_) {
    case Kind::kString: out += repr_string(s_->text); return;
    case Kind::kArray: {
      if (depth > kMaxNesting) {
        out += "[...]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < a_->size() && out.size() <= text_cap; ++i) {
        if (i) out += ", ";
        (*a_)[i].repr_into(depth + 1, out);
      }
      out += ']';
      return;
    }
    case Kind::kObject: {
      if (namespace_) {
        out += "<Namespace>";
        return;
      }
      if (depth > kMaxNesting) {
        out += "{...}";
        return;
      }
      out += '{';
      for (std::size_t i = 0; i < o_->items.size() && out.size() <= text_cap; ++i) {
        if (i) out += ", ";
        out += repr_string(o_->items[i].first);
        out += ": ";
        o_->items[i].second.repr_into(depth + 1, out);
      }
      out += '}';
      return;
    }
    case Kind::kCallable: out += "<function " + name_ + ">"; return;
    case Kind::kUndefined: out += "Undefined"; return;
    default: out += to_str().text; return;
  }
}

Result<std::string> Value::to_json(int indent, bool sort_keys) const {
  std::string out;
  LMSERVE_RETURN_IF_ERROR(json_value(*this, indent, sort_keys, 0, out));
  return out;
}

bool Value::any_taint() const {
  std::size_t visits = 0;
  return any_taint_at(0, visits);
}

bool Value::any_taint_at(int depth, std::size_t& visits) const {
  if (depth > kMaxNesting || ++visits > kMaxVisits) return true;  // a cycle, or too big to walk: assume the worst
  switch (kind_) {
    case Kind::kString: return s_->any_taint();
    case Kind::kArray:
      return std::any_of(a_->begin(), a_->end(), [&](const Value& v) { return v.any_taint_at(depth + 1, visits); });
    case Kind::kObject:
      return std::any_of(o_->items.begin(), o_->items.end(), [&](const auto& kv) { return kv.second.any_taint_at(depth + 1, visits); });
    default: return false;
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kArray: return "list";
    case Kind::kObject: return namespace_ ? "Namespace" : "dict";
    case Kind::kCallable: return "function";
  }
  return "object";
}

namespace {
bool values_equal_at(const Value& a, const Value& b, int depth);
}

bool values_equal(const Value& a, const Value& b) { return values_equal_at(a, b, 0); }

namespace {

bool values_equal_at(const Value& a, const Value& b, int depth) {
  using K = Value::Kind;
  if (depth > Value::kMaxNesting) return false;
  auto numeric = [](const Value& v) { return v.is_number() || v.kind() == K::kBool; };
  if (numeric(a) && numeric(b)) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return a.str().text == b.str().text;
    case K::kArray: {
      const auto &x = a.array_ref(), &y = b.array_ref();
      if (&x == &y) return true;  // every element is itself, and Python compares elements by identity first
      if (x.size() != y.size()) return false;
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (!values_equal_at(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case K::kObject: {
      const auto &x = a.object_ref(), &y = b.object_ref();
      if (&x == &y) return true;
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* o = y.find(k);
        if (o == nullptr || !values_equal_at(v, *o, depth + 1)) return false;
      }
      return true;
    }
    case K::kCallable: return &a.fn() == &b.fn();
    default: return false;
  }
}

}  // namespace

Result<bool> value_less(const Value& a, const Value& b) {
  using K = Value::Kind;
  auto numeric = [](const Value& v) { return v.is_number() || v.kind() == K::kBool; };
  if (numeric(a) && numeric(b)) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str().text < b.str().text;
  if (a.is_array() && b.is_array()) {
    const auto &x = a.array_ref(), &y = b.array_ref();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i])) continue;
      return value_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return error(StatusCode::kInvalidArgument,
               "'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

Value CallArgs::get(std::size_t i, std::string_view name, Value fallback) const {
  if (i < positional.size()) return positional[i];
  for (const auto& [k, v] : named) {
    if (k == name) return v;
  }
  return fallback;
}

}  // namespace lmserve::text::jinja
