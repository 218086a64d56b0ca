#include "text/jinja/parser.h"

#include "text/jinja/lexer.h"

#include <cctype>
#include <charconv>

#include "text/utf8.h"

namespace lmserve::text::jinja {
namespace {

constexpr int kMaxDepth = 256;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Result<Body> parse_all() {
    std::string end;
    auto body = parse_body({}, &end);
    if (!body) return body;
    if (peek().type != Tok::kEof) return error(err("unexpected tag '" + end + "'"));
    return body;
  }

 private:
  const Token& peek(std::size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  Token next() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool is_op(const char* op, std::size_t ahead = 0) const {
    return peek(ahead).type == Tok::kOp && peek(ahead).value == op;
  }
  bool is_name(const char* n, std::size_t ahead = 0) const {
    return peek(ahead).type == Tok::kName && peek(ahead).value == n;
  }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  Status err(const std::string& msg) const { return syntax_error(peek().line, peek().col, msg); }
  Status expect_op(const char* op) {
    if (skip_op(op)) return Status::ok();
    return err(std::string("expected '") + op + "'" + found());
  }
  Status expect_block_end() {
    if (peek().type == Tok::kBlockEnd) {
      ++i_;
      return Status::ok();
    }
    return err("expected end of statement block" + found());
  }
  std::string found() const {
    const Token& t = peek();
    switch (t.type) {
      case Tok::kEof: return ", got end of template";
      case Tok::kBlockEnd: return ", got '%}'";
      case Tok::kVarEnd: return ", got '}}'";
      default: return ", got '" + t.value + "'";
    }
  }
  Result<std::string> expect_name() {
    if (peek().type != Tok::kName) return error(err("expected a name" + found()));
    return next().value;
  }

  // Parses nodes until a block tag whose name is in `ends`; leaves i_ after that name.
  Result<Body> parse_body(const std::vector<std::string>& ends, std::string* end_found) {
    if (++depth_ > kMaxDepth) return error(err("template nests too deeply"));
    Body body;
    while (peek().type != Tok::kEof) {
      const Token& t = peek();
      if (t.type == Tok::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->text = t.value;
        body.push_back(std::move(n));
        ++i_;
      } else if (t.type == Tok::kVarBegin) {
        ++i_;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = t.line;
        n->col = t.col;
        auto e = parse_tuple_or_expr();
        if (!e) return error(e.error());
        n->expr = std::move(*e);
        if (peek().type != Tok::kVarEnd) return error(err("expected '}}'" + found()));
        ++i_;
        body.push_back(std::move(n));
      } else if (t.type == Tok::kBlockBegin) {
        if (peek(1).type == Tok::kName) {
          const std::string& name = peek(1).value;
          for (const auto& e : ends) {
            if (name == e) {
              i_ += 2;
              *end_found = name;
              --depth_;
              return body;
            }
          }
        }
        ++i_;
        auto n = parse_statement();
        if (!n) return error(n.error());
        body.push_back(std::move(*n));
      } else {
        return error(err("unexpected token" + found()));
      }
    }
    if (!ends.empty()) return error(err("unexpected end of template, expected '" + ends.back() + "'"));
    --depth_;
    return body;
  }

  Result<NodePtr> parse_statement() {
    const Token& t = peek();
    if (t.type != Tok::kName) return error(err("expected a statement name" + found()));
    std::string kw = next().value;
    auto n = std::make_unique<Node>();
    n->line = t.line;
    n->col = t.col;
    if (kw == "if") return parse_if(std::move(n));
    if (kw == "for") return parse_for(std::move(n));
    if (kw == "set") return parse_set(std::move(n));
    if (kw == "macro") return parse_macro(std::move(n));
    if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      LMSERVE_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (kw == "filter") {
      n->kind = Node::Kind::kFilterBlock;
      auto name = expect_name();
      if (!name) return error(name.error());
      auto f = std::make_unique<Expr>();
      f->kind = Expr::Kind::kFilter;
      f->name = *name;
      f->args.push_back(nullptr);  // the block's output goes here
      if (is_op("(")) LMSERVE_RETURN_IF_ERROR(parse_call_args(*f));
      n->expr = std::move(f);
      LMSERVE_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      auto body = parse_body({"endfilter"}, &end);
      if (!body) return error(body.error());
      n->body = std::move(*body);
      LMSERVE_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (kw == "generation") {  // transformers' assistant-mask extension: renders its body as is
      n->kind = Node::Kind::kPassthrough;
      LMSERVE_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      auto body = parse_body({"endgeneration"}, &end);
      if (!body) return error(body.error());
      n->body = std::move(*body);
      LMSERVE_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    i_ -= 1;
    return error(err("unknown or unsupported tag '" + kw + "'"));
  }

  Result<NodePtr> parse_if(NodePtr n) {
    n->kind = Node::Kind::kIf;
    while (true) {
      auto cond = parse_expression();
      if (!cond) return error(cond.error());
      LMSERVE_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      auto body = parse_body({"elif", "else", "endif"}, &end);
      if (!body) return error(body.error());
      n->branches.emplace_back(std::move(*cond), std::move(*body));
      if (end == "elif") continue;
      if (end == "else") {
        LMSERVE_RETURN_IF_ERROR(expect_block_end());
        auto else_body = parse_body({"endif"}, &end);
        if (!else_body) return error(else_body.error());
        n->body = std::move(*else_body);
      }
      LMSERVE_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
  }

  Result<NodePtr> parse_for(NodePtr n) {
    n->kind = Node::Kind::kFor;
    do {
      auto name = expect_name();
      if (!name) return error(name.error());
      n->targets.push_back(*name);
    } while (skip_op(","));
    if (!skip_name("in")) return error(err("expected 'in'" + found()));
    auto iter = parse_expression(false);
    if (!iter) return error(iter.error());
    n->expr = std::move(*iter);
    if (skip_name("if")) {
      auto cond = parse_expression();
      if (!cond) return error(cond.error());
      n->condition = std::move(*cond);
    }
    if (skip_name("recursive")) return error(err("recursive for loops are not supported"));
    LMSERVE_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    auto body = parse_body({"else", "endfor"}, &end);
    if (!body) return error(body.error());
    n->body = std::move(*body);
    if (end == "else") {
      LMSERVE_RETURN_IF_ERROR(expect_block_end());
      auto else_body = parse_body({"endfor"}, &end);
      if (!else_body) return error(else_body.error());
      n->else_body = std::move(*else_body);
    }
    LMSERVE_RETURN_IF_ERROR(expect_block_end());
    return n;
  }

  Result<NodePtr> parse_set(NodePtr n) {
    auto first = expect_name();
    if (!first) return error(first.error());
    n->targets.push_back(*first);
    if (skip_op(".")) {
      auto attr = expect_name();
      if (!attr) return error(attr.error());
      n->targets.push_back(*attr);
      n->namespace_target = true;
    } else {
      while (skip_op(",")) {
        auto name = expect_name();
        if (!name) return error(name.error());
        n->targets.push_back(*name);
      }
    }
    if (skip_op("=")) {
      n->kind = Node::Kind::kSet;
      auto value = parse_tuple_or_expr();
      if (!value) return error(value.error());
      n->expr = std::move(*value);
      LMSERVE_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (n->namespace_target || n->targets.size() != 1) return error(err("expected '='" + found()));
    n->kind = Node::Kind::kSetBlock;
    LMSERVE_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    auto body = parse_body({"endset"}, &end);
    if (!body) return error(body.error());
    n->body = std::move(*body);
    LMSERVE_RETURN_IF_ERROR(expect_block_end());
    return n;
  }

  Result<NodePtr> parse_macro(NodePtr n) {
    n->kind = Node::Kind::kMacro;
    auto name = expect_name();
    if (!name) return error(name.error());
    n->name = *name;
    LMSERVE_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      auto param = expect_name();
      if (!param) return error(param.error());
      ExprPtr def;
      if (skip_op("=")) {
        auto d = parse_expression();
        if (!d) return error(d.error());
        def = std::move(*d);
      }
      n->params.emplace_back(*param, std::move(def));
      if (!skip_op(",")) break;
    }
    LMSERVE_RETURN_IF_ERROR(expect_op(")"));
    LMSERVE_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    auto body = parse_body({"endmacro"}, &end);
    if (!body) return error(body.error());
    n->body = std::move(*body);
    LMSERVE_RETURN_IF_ERROR(expect_block_end());
    return n;
  }

  ExprPtr make(Expr::Kind k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = at.line;
    e->col = at.col;
    return e;
  }

  // `a, b` at the top of {{ }} and {% set %} is a tuple.
  Result<ExprPtr> parse_tuple_or_expr() {
    Token at = peek();
    auto first = parse_expression();
    if (!first || !is_op(",")) return first;
    auto tuple = make(Expr::Kind::kTuple, at);
    tuple->args.push_back(std::move(*first));
    while (skip_op(",")) {
      if (peek().type == Tok::kVarEnd || peek().type == Tok::kBlockEnd) break;
      auto e = parse_expression();
      if (!e) return e;
      tuple->args.push_back(std::move(*e));
    }
    return tuple;
  }

  Result<ExprPtr> parse_expression(bool with_condexpr = true) {
    if (++depth_ > kMaxDepth) return error(err("expression nests too deeply"));
    auto e = with_condexpr ? parse_condexpr() : parse_or();
    --depth_;
    return e;
  }

  Result<ExprPtr> parse_condexpr() {
    Token at = peek();
    auto e = parse_or();
    if (!e) return e;
    ExprPtr expr = std::move(*e);
    while (skip_name("if")) {
      auto cond = parse_or();
      if (!cond) return cond;
      ExprPtr other;
      if (skip_name("else")) {
        auto o = parse_condexpr();
        if (!o) return o;
        other = std::move(*o);
      }
      auto c = make(Expr::Kind::kCondExpr, at);
      c->args.push_back(std::move(expr));
      c->args.push_back(std::move(*cond));
      c->args.push_back(std::move(other));
      expr = std::move(c);
    }
    return expr;
  }

  Result<ExprPtr> parse_or() {
    Token at = peek();
    auto l = parse_and();
    if (!l) return l;
    ExprPtr e = std::move(*l);
    while (skip_name("or")) {
      auto r = parse_and();
      if (!r) return r;
      auto n = make(Expr::Kind::kOr, at);
      n->args.push_back(std::move(e));
      n->args.push_back(std::move(*r));
      e = std::move(n);
    }
    return e;
  }

  Result<ExprPtr> parse_and() {
    Token at = peek();
    auto l = parse_not();
    if (!l) return l;
    ExprPtr e = std::move(*l);
    while (skip_name("and")) {
      auto r = parse_not();
      if (!r) return r;
      auto n = make(Expr::Kind::kAnd, at);
      n->args.push_back(std::move(e));
      n->args.push_back(std::move(*r));
      e = std::move(n);
    }
    return e;
  }

  Result<ExprPtr> parse_not() {
    Token at = peek();
    if (is_name("not")) {
      ++i_;
      if (++depth_ > kMaxDepth) return error(err("expression nests too deeply"));
      auto inner = parse_not();
      --depth_;
      if (!inner) return inner;
      auto n = make(Expr::Kind::kNot, at);
      n->args.push_back(std::move(*inner));
      return n;
    }
    return parse_compare();
  }

  Result<ExprPtr> parse_compare() {
    Token at = peek();
    auto l = parse_math1();
    if (!l) return l;
    ExprPtr e = std::move(*l);
    while (true) {
      std::string op;
      if (peek().type == Tok::kOp && (peek().value == "==" || peek().value == "!=" || peek().value == "<" ||
                                      peek().value == "<=" || peek().value == ">" || peek().value == ">=")) {
        op = next().value;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        i_ += 2;
        op = "not in";
      } else {
        return e;
      }
      auto r = parse_math1();
      if (!r) return r;
      auto n = make(Expr::Kind::kBinary, at);
      n->name = op;
      n->args.push_back(std::move(e));
      n->args.push_back(std::move(*r));
      e = std::move(n);
    }
  }

  template <typename Next>
  Result<ExprPtr> parse_binary_level(std::initializer_list<const char*> ops, Next next_level) {
    Token at = peek();
    auto l = (this->*next_level)();
    if (!l) return l;
    ExprPtr e = std::move(*l);
    while (true) {
      const char* matched = nullptr;
      for (const char* op : ops) {
        if (is_op(op)) matched = op;
      }
      if (!matched) return e;
      ++i_;
      auto r = (this->*next_level)();
      if (!r) return r;
      auto n = make(Expr::Kind::kBinary, at);
      n->name = matched;
      n->args.push_back(std::move(e));
      n->args.push_back(std::move(*r));
      e = std::move(n);
    }
  }
  Result<ExprPtr> parse_math1() { return parse_binary_level({"+", "-"}, &Parser::parse_concat); }
  Result<ExprPtr> parse_concat() { return parse_binary_level({"~"}, &Parser::parse_math2); }
  Result<ExprPtr> parse_math2() { return parse_binary_level({"*", "/", "//", "%"}, &Parser::parse_pow); }
  Result<ExprPtr> parse_pow() { return parse_binary_level({"**"}, &Parser::parse_unary_filtered); }
  Result<ExprPtr> parse_unary_filtered() { return parse_unary(true); }

  Result<ExprPtr> parse_unary(bool with_filter) {
    Token at = peek();
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      bool neg = next().value == "-";
      if (++depth_ > kMaxDepth) return error(err("expression nests too deeply"));
      auto inner = parse_unary(false);
      --depth_;
      if (!inner) return inner;
      e = make(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, at);
      e->args.push_back(std::move(*inner));
    } else {
      auto p = parse_primary();
      if (!p) return p;
      e = std::move(*p);
    }
    auto post = parse_postfix(std::move(e));
    if (!post || !with_filter) return post;
    return parse_filters(std::move(*post));
  }

  Result<ExprPtr> parse_primary() {
    Token t = peek();
    switch (t.type) {
      case Tok::kName: {
        ++i_;
        if (t.value == "true" || t.value == "True") return literal(Value::boolean(true), t);
        if (t.value == "false" || t.value == "False") return literal(Value::boolean(false), t);
        if (t.value == "none" || t.value == "None") return literal(Value::none(), t);
        auto e = make(Expr::Kind::kName, t);
        e->name = t.value;
        return e;
      }
      case Tok::kString: {
        std::string s;
        while (peek().type == Tok::kString) s += next().value;  // adjacent literals concatenate
        return literal(Value::string(std::move(s)), t);
      }
      case Tok::kInt: {
        ++i_;
        std::int64_t v = 0;
        auto r = std::from_chars(t.value.data(), t.value.data() + t.value.size(), v);
        if (r.ec != std::errc()) return error(syntax_error(t.line, t.col, "integer literal out of range"));
        return literal(Value::integer(v), t);
      }
      case Tok::kFloat: {
        ++i_;
        return literal(Value::number(std::strtod(t.value.c_str(), nullptr)), t);
      }
      case Tok::kOp:
        if (t.value == "(") {
          ++i_;
          if (skip_op(")")) return make(Expr::Kind::kTuple, t);
          auto e = parse_expression();
          if (!e) return e;
          if (is_op(",")) {
            auto tuple = make(Expr::Kind::kTuple, t);
            tuple->args.push_back(std::move(*e));
            while (skip_op(",")) {
              if (is_op(")")) break;
              auto x = parse_expression();
              if (!x) return x;
              tuple->args.push_back(std::move(*x));
            }
            LMSERVE_RETURN_IF_ERROR(expect_op(")"));
            return tuple;
          }
          LMSERVE_RETURN_IF_ERROR(expect_op(")"));
          return e;
        }
        if (t.value == "[") {
          ++i_;
          auto list = make(Expr::Kind::kList, t);
          while (!is_op("]")) {
            auto x = parse_expression();
            if (!x) return x;
            list->args.push_back(std::move(*x));
            if (!skip_op(",")) break;
          }
          LMSERVE_RETURN_IF_ERROR(expect_op("]"));
          return list;
        }
        if (t.value == "{") {
          ++i_;
          auto dict = make(Expr::Kind::kDict, t);
          while (!is_op("}")) {
            auto k = parse_expression();
            if (!k) return k;
            LMSERVE_RETURN_IF_ERROR(expect_op(":"));
            auto v = parse_expression();
            if (!v) return v;
            dict->pairs.emplace_back(std::move(*k), std::move(*v));
            if (!skip_op(",")) break;
          }
          LMSERVE_RETURN_IF_ERROR(expect_op("}"));
          return dict;
        }
        break;
      default: break;
    }
    return error(err("unexpected token" + found()));
  }

  Result<ExprPtr> literal(Value v, const Token& t) {
    auto e = make(Expr::Kind::kLiteral, t);
    e->value = std::move(v);
    return e;
  }

  Status parse_call_args(Expr& call) {
    LMSERVE_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (peek().type == Tok::kName && is_op("=", 1)) {
        std::string name = next().value;
        ++i_;
        auto v = parse_expression();
        if (!v) return v.error();
        call.kwargs.emplace_back(std::move(name), std::move(*v));
      } else {
        if (!call.kwargs.empty()) return err("positional argument follows keyword argument");
        auto v = parse_expression();
        if (!v) return v.error();
        call.args.push_back(std::move(*v));
      }
      if (!skip_op(",")) break;
    }
    return expect_op(")");
  }

  Result<ExprPtr> parse_postfix(ExprPtr e) {
    while (true) {
      Token at = peek();
      if (skip_op(".")) {
        auto n = make(Expr::Kind::kGetAttr, at);
        if (peek().type == Tok::kName || peek().type == Tok::kInt) {
          n->name = next().value;
        } else {
          return error(err("expected an attribute name" + found()));
        }
        n->args.push_back(std::move(e));
        e = std::move(n);
      } else if (skip_op("[")) {
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) {
            auto x = parse_expression();
            if (!x) return x;
            parts[k] = std::move(*x);
          }
          if (k < 2 && skip_op(":")) {
            slice = true;
            continue;
          }
          break;
        }
        LMSERVE_RETURN_IF_ERROR(expect_op("]"));
        auto n = make(slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem, at);
        n->args.push_back(std::move(e));
        if (!slice && !parts[0]) return error(syntax_error(at.line, at.col, "empty subscript"));
        for (auto& p : parts) {
          if (slice || p) n->args.push_back(std::move(p));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = make(Expr::Kind::kCall, at);
        n->args.push_back(std::move(e));
        LMSERVE_RETURN_IF_ERROR(parse_call_args(*n));
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> parse_filters(ExprPtr e) {
    while (true) {
      Token at = peek();
      if (skip_op("|")) {
        auto name = expect_name();
        if (!name) return error(name.error());
        auto n = make(Expr::Kind::kFilter, at);
        n->name = *name;
        n->args.push_back(std::move(e));
        if (is_op("(")) LMSERVE_RETURN_IF_ERROR(parse_call_args(*n));
        e = std::move(n);
      } else if (skip_name("is")) {
        auto n = make(Expr::Kind::kTest, at);
        n->negated = skip_name("not");
        auto name = expect_name();
        if (!name) return error(name.error());
        n->name = *name;
        n->args.push_back(std::move(e));
        if (is_op("(")) {
          LMSERVE_RETURN_IF_ERROR(parse_call_args(*n));
        } else if (peek().type == Tok::kString || peek().type == Tok::kInt || peek().type == Tok::kFloat ||
                   (peek().type == Tok::kName && peek().value != "else" && peek().value != "or" &&
                    peek().value != "and" && peek().value != "if" && peek().value != "not" && peek().value != "is" &&
                    peek().value != "in") ||
                   is_op("[") || is_op("{")) {
          auto arg = parse_primary();
          if (!arg) return arg;
          auto post = parse_postfix(std::move(*arg));
          if (!post) return post;
          n->args.push_back(std::move(*post));
        }
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  std::size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<Body> parse_template(std::string_view source) {
  auto tokens = lex_template(source);
  if (!tokens) return error(tokens.error());
  Parser parser(std::move(*tokens));
  return parser.parse_all();
}

}  // namespace lmserve::text::jinja
