#include <algorithm>
#include <cmath>

#include "text/jinja/interpreter.h"
#include "text/jinja/parser.h"
#include "text/utf8.h"

namespace lmserve::text::jinja {

Status type_error(const std::string& msg) { return Status(StatusCode::kInvalidArgument, "TypeError: " + msg); }

Status undefined_error(const Value& v) {
  return Status(StatusCode::kInvalidArgument,
                "UndefinedError: '" + (v.name().empty() ? std::string("value") : v.name()) + "' is undefined");
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp;
    int n = utf8_decode(s, i, &cp);
    if (n == 0) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

Result<Array> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return Array{};
    case Value::Kind::kArray: return v.array_ref();
    case Value::Kind::kObject: {
      Array keys;
      for (const auto& kv : v.object_ref().items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Value::Kind::kString: {
      Array chars;
      for (auto& c : utf8_chars(v.str().text)) chars.push_back(Value::string(std::move(c), v.str().any_taint()));
      return chars;
    }
    default: return error(type_error("'" + v.type_name() + "' object is not iterable"));
  }
}

Interpreter::Interpreter(const RenderOptions& options) : options_(options) {
  frames_.push_back(std::make_shared<Frame>());  // globals
  frames_.push_back(std::make_shared<Frame>());  // template-level variables
}

Interpreter::~Interpreter() {
  for (auto& ns : namespaces_) ns.object_ref().items.clear();
  for (auto& f : frames_) f->clear();
}

Status Interpreter::step() {
  if (++steps_ > options_.max_steps) {
    return Status(StatusCode::kResourceExhausted, "template rendering exceeded " + std::to_string(options_.max_steps) + " steps");
  }
  return Status::ok();
}

Status Interpreter::append(Str& out, const Str& s) {
  output_ += s.text.size();
  if (output_ > options_.max_output_bytes) {
    return Status(StatusCode::kResourceExhausted, "template output exceeded " + std::to_string(options_.max_output_bytes) + " bytes");
  }
  out.append(s);
  return Status::ok();
}

Value Interpreter::lookup(const std::string& name) const {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    auto f = (*it)->find(name);
    if (f != (*it)->end()) return f->second;
  }
  return Value::undefined(name);
}

Status Interpreter::exec(const Body& body, Str& out) {
  for (const auto& n : body) {
    LMSERVE_RETURN_IF_ERROR(exec_node(*n, out));
    if (flow_ != Flow::kNormal) return Status::ok();
  }
  return Status::ok();
}

Status Interpreter::assign_targets(const std::vector<std::string>& targets, const Value& v, Frame& frame) {
  if (targets.size() == 1) {
    frame[targets[0]] = v;
    return Status::ok();
  }
  auto items = iterate(v);
  if (!items) return items.error();
  if (items->size() != targets.size()) {
    return Status(StatusCode::kInvalidArgument, "ValueError: expected " + std::to_string(targets.size()) +
                                                    " values to unpack, got " + std::to_string(items->size()));
  }
  for (std::size_t i = 0; i < targets.size(); ++i) frame[targets[i]] = (*items)[i];
  return Status::ok();
}

Status Interpreter::exec_node(const Node& n, Str& out) {
  LMSERVE_RETURN_IF_ERROR(step());
  switch (n.kind) {
    case Node::Kind::kText: return append(out, Str{n.text, {}});
    case Node::Kind::kOutput: {
      auto v = eval(*n.expr);
      if (!v) return v.error();
      return append(out, v->to_str());
    }
    case Node::Kind::kIf: {
      for (const auto& [cond, body] : n.branches) {
        auto c = eval(*cond);
        if (!c) return c.error();
        if (c->truthy()) return exec(body, out);
      }
      return exec(n.body, out);
    }
    case Node::Kind::kFor: return exec_for(n, out);
    case Node::Kind::kSet: {
      auto v = eval(*n.expr);
      if (!v) return v.error();
      if (n.namespace_target) {
        Value ns = lookup(n.targets[0]);
        if (!ns.is_namespace()) {
          return Status(StatusCode::kInvalidArgument, "TemplateRuntimeError: cannot assign attribute on non-namespace object");
        }
        ns.object_ref().set(n.targets[1], std::move(*v));
        return Status::ok();
      }
      return assign_targets(n.targets, *v, *frames_.back());
    }
    case Node::Kind::kSetBlock: {
      Str captured;
      LMSERVE_RETURN_IF_ERROR(exec(n.body, captured));
      (*frames_.back())[n.targets[0]] = Value::string(std::move(captured));
      return Status::ok();
    }
    case Node::Kind::kMacro: (*frames_.back())[n.name] = make_macro(n); return Status::ok();
    case Node::Kind::kBreak: flow_ = Flow::kBreak; return Status::ok();
    case Node::Kind::kContinue: flow_ = Flow::kContinue; return Status::ok();
    case Node::Kind::kFilterBlock: {
      Str captured;
      LMSERVE_RETURN_IF_ERROR(exec(n.body, captured));
      auto args = eval_args(*n.expr, 1);
      if (!args) return args.error();
      auto v = apply_filter(n.expr->name, Value::string(std::move(captured)), *args);
      if (!v) return v.error();
      return append(out, v->to_str());
    }
    case Node::Kind::kPassthrough: return exec(n.body, out);
  }
  return Status::ok();
}

Status Interpreter::exec_for(const Node& n, Str& out) {
  auto iterable = eval(*n.expr);
  if (!iterable) return iterable.error();
  auto items = iterate(*iterable);
  if (!items) return items.error();
  auto frame = std::make_shared<Frame>();
  frames_.push_back(frame);
  struct Pop {
    std::vector<std::shared_ptr<Frame>>& f;
    ~Pop() { f.pop_back(); }
  } pop{frames_};

  Array selected;
  if (n.condition) {
    for (const auto& item : *items) {
      LMSERVE_RETURN_IF_ERROR(assign_targets(n.targets, item, *frame));
      auto keep = eval(*n.condition);
      if (!keep) return keep.error();
      if (keep->truthy()) selected.push_back(item);
    }
  } else {
    selected = std::move(*items);
  }
  if (selected.empty()) return exec(n.else_body, out);

  const auto len = static_cast<std::int64_t>(selected.size());
  for (std::int64_t i = 0; i < len; ++i) {
    LMSERVE_RETURN_IF_ERROR(assign_targets(n.targets, selected[i], *frame));
    Value loop = Value::object();
    auto& o = loop.object_ref();
    o.set("index", Value::integer(i + 1));
    o.set("index0", Value::integer(i));
    o.set("revindex", Value::integer(len - i));
    o.set("revindex0", Value::integer(len - i - 1));
    o.set("first", Value::boolean(i == 0));
    o.set("last", Value::boolean(i == len - 1));
    o.set("length", Value::integer(len));
    o.set("depth", Value::integer(1));
    o.set("depth0", Value::integer(0));
    o.set("previtem", i > 0 ? selected[i - 1] : Value::undefined("previtem"));
    o.set("nextitem", i + 1 < len ? selected[i + 1] : Value::undefined("nextitem"));
    o.set("cycle", Value::callable("cycle", [i](CallArgs& a) -> Result<Value> {
            if (a.positional.empty()) return error(type_error("no items for cycling given"));
            return a.positional[static_cast<std::size_t>(i) % a.positional.size()];
          }));
    (*frame)["loop"] = loop;
    LMSERVE_RETURN_IF_ERROR(exec(n.body, out));
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  return Status::ok();
}

Value Interpreter::make_macro(const Node& n) {
  return Value::callable(n.name, [this, &n](CallArgs& args) -> Result<Value> {
    if (++call_depth_ > 64) {
      --call_depth_;
      return error(StatusCode::kResourceExhausted, "macro recursion deeper than 64");
    }
    auto frame = std::make_shared<Frame>();
    std::size_t used = 0;
    for (std::size_t i = 0; i < n.params.size(); ++i) {
      const auto& [name, def] = n.params[i];
      Value v = args.get(i, name, Value::undefined(name));
      if (i < args.positional.size()) ++used;
      if (v.is_undefined() && def) {
        auto d = eval(*def);
        if (!d) {
          --call_depth_;
          return error(d.error());
        }
        v = *d;
      }
      (*frame)[name] = v;
    }
    Array varargs(args.positional.begin() + static_cast<std::ptrdiff_t>(std::min(used, args.positional.size())),
                  args.positional.end());
    (*frame)["varargs"] = Value::array(std::move(varargs));
    auto saved = std::move(frames_);
    frames_ = {saved[0], saved[1], frame};
    Str out;
    Status s = exec(n.body, out);
    flow_ = Flow::kNormal;
    frames_ = std::move(saved);
    --call_depth_;
    if (!s.is_ok()) return error(s);
    return Value::string(std::move(out));
  });
}

Result<CallArgs> Interpreter::eval_args(const Expr& e, std::size_t first_arg) {
  CallArgs args;
  for (std::size_t i = first_arg; i < e.args.size(); ++i) {
    auto v = eval(*e.args[i]);
    if (!v) return error(v.error());
    args.positional.push_back(std::move(*v));
  }
  for (const auto& [k, x] : e.kwargs) {
    auto v = eval(*x);
    if (!v) return error(v.error());
    args.named.emplace_back(k, std::move(*v));
  }
  return args;
}

Result<Value> Interpreter::get_attr(const Value& obj, const std::string& name, const Expr& at) {
  (void)at;
  if (obj.is_undefined()) return error(undefined_error(obj));
  if (auto m = method(obj, name)) return *m;
  if (obj.is_object()) {
    if (const Value* v = obj.object_ref().find(name)) return *v;
  }
  return Value::undefined(name);
}

Result<Value> Interpreter::get_item(const Value& obj, const Value& key, const Expr& at) {
  if (obj.is_undefined()) return error(undefined_error(obj));
  if (obj.is_object()) {
    if (key.is_string()) {
      if (const Value* v = obj.object_ref().find(key.str().text)) return *v;
      if (auto m = method(obj, key.str().text)) return *m;
    }
    return Value::undefined(key.is_string() ? key.str().text : key.repr());
  }
  if ((obj.is_array() || obj.is_string()) && (key.kind() == Value::Kind::kInt || key.kind() == Value::Kind::kBool)) {
    std::int64_t i = key.as_int();
    if (obj.is_array()) {
      auto n = static_cast<std::int64_t>(obj.array_ref().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("[" + std::to_string(key.as_int()) + "]");
      return obj.array_ref()[static_cast<std::size_t>(i)];
    }
    auto chars = utf8_chars(obj.str().text);
    auto n = static_cast<std::int64_t>(chars.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("[" + std::to_string(key.as_int()) + "]");
    return Value::string(chars[static_cast<std::size_t>(i)], obj.str().any_taint());
  }
  if (key.is_string()) return get_attr(obj, key.str().text, at);
  return Value::undefined("[" + key.repr() + "]");
}

namespace {

// Python slice bounds for a sequence of length n.
void slice_bounds(std::int64_t n, const Value& lo, const Value& hi, std::int64_t step, std::int64_t* start,
                  std::int64_t* stop) {
  auto clamp = [&](const Value& v, std::int64_t def) {
    if (v.is_undefined() || v.is_none()) return def;
    std::int64_t x = v.as_int();
    if (x < 0) x += n;
    if (step > 0) return std::clamp<std::int64_t>(x, 0, n);
    return std::clamp<std::int64_t>(x, -1, n - 1);
  };
  *start = clamp(lo, step > 0 ? 0 : n - 1);
  *stop = clamp(hi, step > 0 ? n : -1);
}

}  // namespace

Result<Value> Interpreter::eval(const Expr& e) {
  LMSERVE_RETURN_IF_ERROR(step());
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.value;
    case Expr::Kind::kName: return lookup(e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      Array a;
      for (const auto& x : e.args) {
        auto v = eval(*x);
        if (!v) return v;
        a.push_back(std::move(*v));
      }
      return Value::array(std::move(a));
    }
    case Expr::Kind::kDict: {
      Value d = Value::object();
      for (const auto& [k, x] : e.pairs) {
        auto key = eval(*k);
        if (!key) return key;
        auto v = eval(*x);
        if (!v) return v;
        d.object_ref().set(key->is_string() ? key->str().text : key->to_str().text, std::move(*v));
      }
      return d;
    }
    case Expr::Kind::kGetAttr: {
      auto obj = eval(*e.args[0]);
      if (!obj) return obj;
      return get_attr(*obj, e.name, e);
    }
    case Expr::Kind::kGetItem: {
      auto obj = eval(*e.args[0]);
      if (!obj) return obj;
      auto key = eval(*e.args[1]);
      if (!key) return key;
      return get_item(*obj, *key, e);
    }
    case Expr::Kind::kSlice: {
      auto obj = eval(*e.args[0]);
      if (!obj) return obj;
      Value parts[3];
      for (int k = 0; k < 3; ++k) {
        if (e.args[k + 1]) {
          auto v = eval(*e.args[k + 1]);
          if (!v) return v;
          parts[k] = *v;
        }
      }
      std::int64_t step = parts[2].is_number() ? parts[2].as_int() : 1;
      if (step == 0) return error(StatusCode::kInvalidArgument, "ValueError: slice step cannot be zero");
      if (obj->is_undefined()) return error(undefined_error(*obj));
      std::vector<std::string> chars;
      bool is_str = obj->is_string();
      if (is_str) chars = utf8_chars(obj->str().text);
      if (!is_str && !obj->is_array()) return error(type_error("'" + obj->type_name() + "' object is not subscriptable"));
      auto n = static_cast<std::int64_t>(is_str ? chars.size() : obj->array_ref().size());
      std::int64_t start, stop;
      slice_bounds(n, parts[0], parts[1], step, &start, &stop);
      Array out;
      std::string s;
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (is_str) {
          s += chars[static_cast<std::size_t>(i)];
        } else {
          out.push_back(obj->array_ref()[static_cast<std::size_t>(i)]);
        }
      }
      if (is_str) return Value::string(std::move(s), obj->str().any_taint());
      return Value::array(std::move(out));
    }
    case Expr::Kind::kCall: return eval_call(e);
    case Expr::Kind::kFilter: {
      auto input = eval(*e.args[0]);
      if (!input) return input;
      auto args = eval_args(e, 1);
      if (!args) return error(args.error());
      return apply_filter(e.name, *input, *args);
    }
    case Expr::Kind::kTest: {
      auto input = eval(*e.args[0]);
      if (!input) return input;
      auto args = eval_args(e, 1);
      if (!args) return error(args.error());
      auto r = apply_test(e.name, *input, *args);
      if (!r) return error(r.error());
      return Value::boolean(*r != e.negated);
    }
    case Expr::Kind::kNot: {
      auto v = eval(*e.args[0]);
      if (!v) return v;
      return Value::boolean(!v->truthy());
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      auto v = eval(*e.args[0]);
      if (!v) return v;
      if (v->is_undefined()) return error(undefined_error(*v));
      if (!v->is_number() && v->kind() != Value::Kind::kBool) {
        return error(type_error("bad operand type for unary " + std::string(e.kind == Expr::Kind::kNeg ? "-" : "+") +
                                ": '" + v->type_name() + "'"));
      }
      if (e.kind == Expr::Kind::kPos) return v->kind() == Value::Kind::kBool ? Value::integer(v->as_int()) : *v;
      return v->kind() == Value::Kind::kFloat ? Value::number(-v->as_double()) : Value::integer(-v->as_int());
    }
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {
      auto l = eval(*e.args[0]);
      if (!l) return l;
      bool short_circuit = e.kind == Expr::Kind::kAnd ? !l->truthy() : l->truthy();
      if (short_circuit) return l;
      return eval(*e.args[1]);
    }
    case Expr::Kind::kCondExpr: {
      auto c = eval(*e.args[1]);
      if (!c) return c;
      if (c->truthy()) return eval(*e.args[0]);
      if (e.args[2]) return eval(*e.args[2]);
      return Value::undefined("inline if");
    }
    case Expr::Kind::kBinary: return eval_binary(e);
  }
  return Value();
}

Result<Value> Interpreter::eval_call(const Expr& e) {
  auto callee = eval(*e.args[0]);
  if (!callee) return callee;
  auto args = eval_args(e, 1);
  if (!args) return error(args.error());
  if (callee->is_undefined()) return error(undefined_error(*callee));
  if (!callee->is_callable()) return error(type_error("'" + callee->type_name() + "' object is not callable"));
  return callee->fn()(*args);
}

namespace {

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Result<Value> Interpreter::eval_binary(const Expr& e) {
  auto lr = eval(*e.args[0]);
  if (!lr) return lr;
  auto rr = eval(*e.args[1]);
  if (!rr) return rr;
  const Value &l = *lr, &r = *rr;
  const std::string& op = e.name;
  using K = Value::Kind;
  auto numeric = [](const Value& v) { return v.is_number() || v.kind() == K::kBool; };

  if (op == "==") return Value::boolean(values_equal(l, r));
  if (op == "!=") return Value::boolean(!values_equal(l, r));
  if (op == "in" || op == "not in") {
    bool found = false;
    if (r.is_string()) {
      if (!l.is_string()) return error(type_error("'in <string>' requires string as left operand, not " + l.type_name()));
      found = r.str().text.find(l.str().text) != std::string::npos;
    } else if (r.is_object()) {
      found = l.is_string() && r.object_ref().find(l.str().text) != nullptr;
    } else {
      auto items = iterate(r);
      if (!items) return error(type_error("argument of type '" + r.type_name() + "' is not iterable"));
      for (const auto& x : *items) found = found || values_equal(x, l);
    }
    return Value::boolean(found == (op == "in"));
  }
  if (op == "~") {
    Str s = l.to_str();
    s.append(r.to_str());
    return Value::string(std::move(s));
  }
  if (l.is_undefined()) return error(undefined_error(l));
  if (r.is_undefined()) return error(undefined_error(r));
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    Result<bool> lt = op == "<" || op == ">=" ? value_less(l, r) : value_less(r, l);
    if (!lt) {
      return error(type_error("'" + op + "' not supported between instances of '" + l.type_name() + "' and '" +
                              r.type_name() + "'"));
    }
    return Value::boolean(op == "<" || op == ">" ? *lt : !*lt);
  }
  auto unsupported = [&]() {
    return error(type_error("unsupported operand type(s) for " + op + ": '" + l.type_name() + "' and '" + r.type_name() + "'"));
  };
  if (op == "+") {
    if (l.is_string() && r.is_string()) {
      Str s = l.str();
      s.append(r.str());
      return Value::string(std::move(s));
    }
    if (l.is_string()) return error(type_error("can only concatenate str (not \"" + r.type_name() + "\") to str"));
    if (l.is_array() && r.is_array()) {
      Array a = l.array_ref();
      a.insert(a.end(), r.array_ref().begin(), r.array_ref().end());
      return Value::array(std::move(a));
    }
    if (l.is_array()) return error(type_error("can only concatenate list (not \"" + r.type_name() + "\") to list"));
  }
  if (op == "*" && ((l.is_string() || l.is_array()) != (r.is_string() || r.is_array()))) {
    const Value& seq = l.is_string() || l.is_array() ? l : r;
    const Value& times = l.is_string() || l.is_array() ? r : l;
    if (times.kind() != K::kInt && times.kind() != K::kBool) return unsupported();
    std::int64_t n = std::max<std::int64_t>(0, times.as_int());
    if (n * static_cast<std::int64_t>(seq.is_string() ? seq.str().text.size() : seq.array_ref().size()) >
        static_cast<std::int64_t>(options_.max_output_bytes)) {
      return error(StatusCode::kResourceExhausted, "sequence repetition too large");
    }
    if (seq.is_string()) {
      Str s;
      for (std::int64_t i = 0; i < n; ++i) s.append(seq.str());
      return Value::string(std::move(s));
    }
    Array a;
    for (std::int64_t i = 0; i < n; ++i) a.insert(a.end(), seq.array_ref().begin(), seq.array_ref().end());
    return Value::array(std::move(a));
  }
  if (!numeric(l) || !numeric(r)) return unsupported();
  bool fl = l.kind() == K::kFloat || r.kind() == K::kFloat;
  double a = l.as_double(), b = r.as_double();
  std::int64_t x = l.as_int(), y = r.as_int(), v = 0;
  // Python's ints have no bound; ours are 64-bit, and a result outside them is an error (not
  // undefined behaviour; found by template_fuzz under UBSan).
  auto checked = [&](bool overflow) -> Result<Value> {
    if (overflow) return error(StatusCode::kInvalidArgument, "OverflowError: integer result outside the 64-bit range");
    return Value::integer(v);
  };
  if (op == "+") return fl ? Value::number(a + b) : checked(__builtin_add_overflow(x, y, &v));
  if (op == "-") return fl ? Value::number(a - b) : checked(__builtin_sub_overflow(x, y, &v));
  if (op == "*") return fl ? Value::number(a * b) : checked(__builtin_mul_overflow(x, y, &v));
  if (op == "/") {
    if (b == 0) return error(StatusCode::kInvalidArgument, "ZeroDivisionError: division by zero");
    return Value::number(a / b);
  }
  if (op == "//" || op == "%") {
    if (b == 0) return error(StatusCode::kInvalidArgument, "ZeroDivisionError: integer division or modulo by zero");
    if (fl) {
      double q = std::floor(a / b);
      return op == "//" ? Value::number(q) : Value::number(a - q * b);
    }
    if (y == -1) {  // x // -1 = -x (overflows only for the smallest int), x % -1 = 0
      if (op == "%") return Value::integer(0);
      return checked(__builtin_sub_overflow(std::int64_t{0}, x, &v));
    }
    if (op == "//") return Value::integer(floor_div(x, y));
    std::int64_t rem = x % y;  // the sign of y, as Python's (rem + y stays in range: |rem| < |y|)
    if (rem != 0 && (rem < 0) != (y < 0)) rem += y;
    return Value::integer(rem);
  }
  if (op == "**") {
    if (!fl && y >= 0) {
      if (x == 0 || x == 1) return Value::integer(y == 0 ? 1 : x);
      if (x == -1) return Value::integer(y % 2 ? -1 : 1);
      v = 1;  // |x| >= 2: past 63 factors it has overflowed
      for (std::int64_t i = 0; i < y; ++i) {
        if (__builtin_mul_overflow(v, x, &v)) return checked(true);
      }
      return Value::integer(v);
    }
    return Value::number(std::pow(a, b));
  }
  return unsupported();
}

Result<Template> Template::parse(std::string_view source) {
  auto body = parse_template(source);
  if (!body) return error(body.error());
  Template t;
  t.body_ = std::make_shared<const Body>(std::move(*body));
  return t;
}

Result<Str> Template::render(const std::vector<std::pair<std::string, Value>>& variables, const RenderOptions& options) const {
  Interpreter in(options);
  // Text past the output limit can never be rendered: repr/tojson of a runaway value stop there.
  Value::TextCap cap(std::min(options.max_output_bytes, Value::kMaxTextBytes) + 1);
  in.install_globals();
  for (const auto& [k, v] : variables) in.define_global(k, v);
  Str out;
  LMSERVE_RETURN_IF_ERROR(in.exec(*body_, out));
  return out;
}

}  // namespace lmserve::text::jinja
