#include "text/byte_dfa.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace lmserve::text {
namespace {

using Ranges = std::vector<std::pair<std::uint32_t, std::uint32_t>>;  // code points, inclusive
constexpr std::uint32_t kMaxCode = 0x10FFFF;
constexpr int kMaxNfaStates = 50000;
// The subset construction's work (NFA states visited over all DFA states and bytes): a pattern a
// request sends must not hold a thread for seconds.
constexpr std::uint64_t kMaxWork = 20'000'000;
constexpr int kUnbounded = -1;

// Sorted, merged, without the surrogates (no UTF-8 text holds them).
Ranges normalise(Ranges r) {
  Ranges cut;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    if (lo < 0xD800 && hi > 0xDFFF) {
      cut.emplace_back(lo, 0xD7FF);
      cut.emplace_back(0xE000, hi);
    } else if (lo >= 0xD800 && hi <= 0xDFFF) {
      continue;
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      cut.emplace_back(0xE000, hi);
    } else if (hi >= 0xD800 && hi <= 0xDFFF) {
      cut.emplace_back(lo, 0xD7FF);
    } else {
      cut.emplace_back(lo, hi);
    }
  }
  std::sort(cut.begin(), cut.end());
  Ranges out;
  for (auto [lo, hi] : cut) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges n = normalise(r), out;
  std::uint32_t next = 0;
  for (auto [lo, hi] : n) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCode) out.emplace_back(next, kMaxCode);
  return normalise(out);
}

const Ranges& digits() {
  static const Ranges r{{'0', '9'}};
  return r;
}
const Ranges& word() {
  static const Ranges r{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const Ranges& spaces() {  // ECMA-262's WhiteSpace and LineTerminator
  static const Ranges r = normalise({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                                     {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
  return r;
}
const Ranges& dot(bool dot_all) {  // every character but ECMA's line terminators
  static const Ranges all{{0, kMaxCode}};
  static const Ranges no_newline = complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});
  return dot_all ? all : no_newline;
}

struct Node {
  enum Kind { kClass, kConcat, kAlt, kRepeat } kind = kConcat;
  Ranges ranges;
  std::vector<Node> kids;
  int min = 0, max = 0;
};

class Parser {
 public:
  Parser(std::string_view p, const ByteDfa::Options& o) : p_(p), o_(o) {}

  Result<Node> parse(bool* anchored_start, bool* anchored_end) {
    *anchored_start = *anchored_end = false;
    if (!p_.empty() && p_[0] == '^') {
      *anchored_start = true;
      ++i_;
    }
    Node n = alternation();
    if (err_.empty() && i_ < p_.size()) err_ = p_[i_] == ')' ? "unbalanced ')'" : "unexpected '" + std::string(1, p_[i_]) + "'";
    if (!err_.empty()) return error(StatusCode::kInvalidArgument, "pattern: " + err_);
    *anchored_end = end_anchor_;
    return n;
  }

 private:
  bool more() const { return err_.empty() && i_ < p_.size(); }

  Node alternation() {
    Node alt{Node::kAlt, {}, {}, 0, 0};
    alt.kids.push_back(concat());
    while (more() && p_[i_] == '|') {
      ++i_;
      alt.kids.push_back(concat());
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Node concat() {
    Node c{Node::kConcat, {}, {}, 0, 0};
    while (more() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$') {
        if (i_ + 1 != p_.size() || depth_ > 0) {
          err_ = "'$' is supported only at the end of the pattern";
          return c;
        }
        end_anchor_ = true;
        ++i_;
        break;
      }
      if (p_[i_] == '^') {
        err_ = "'^' is supported only at the start of the pattern";
        return c;
      }
      Node a = atom();
      if (!err_.empty()) return c;
      c.kids.push_back(quantified(std::move(a)));
    }
    return c;
  }

  Node quantified(Node a) {
    while (more()) {
      int mn = 0, mx = 0;
      const char q = p_[i_];
      if (q == '*') {
        mn = 0, mx = kUnbounded, ++i_;
      } else if (q == '+') {
        mn = 1, mx = kUnbounded, ++i_;
      } else if (q == '?') {
        mn = 0, mx = 1, ++i_;
      } else if (q == '{' && counted(&mn, &mx)) {
      } else {
        break;
      }
      if (more() && p_[i_] == '?') ++i_;  // lazy: the same language
      if (more() && p_[i_] == '+') {
        err_ = "possessive quantifiers are not supported";
        return a;
      }
      Node r{Node::kRepeat, {}, {}, mn, mx};
      r.kids.push_back(std::move(a));
      a = std::move(r);
    }
    return a;
  }

  // {n}, {n,}, {n,m}; false (nothing consumed) when the brace is a literal, as ECMA reads it.
  bool counted(int* mn, int* mx) {
    std::size_t j = i_ + 1;
    auto number = [&](int* out) {
      const std::size_t s = j;
      long v = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9' && v <= 100000) v = v * 10 + (p_[j++] - '0');
      *out = static_cast<int>(v);
      return j > s;
    };
    if (!number(mn)) return false;
    *mx = *mn;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      if (!number(mx)) *mx = kUnbounded;
    }
    if (j >= p_.size() || p_[j] != '}') return false;
    i_ = j + 1;
    if (*mn > 1000 || *mx > 1000) {
      err_ = "a repetition count above 1000 is not supported";
    } else if (*mx != kUnbounded && *mx < *mn) {
      err_ = "a repetition {n,m} with m < n";
    }
    return true;
  }

  static Node cls(Ranges r) { return Node{Node::kClass, normalise(std::move(r)), {}, 0, 0}; }

  Node atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (p_.substr(i_, 2) == "?:") {
        i_ += 2;
      } else if (p_.substr(i_, 2) == "?<" && p_.substr(i_, 3) != "?<=" && p_.substr(i_, 3) != "?<!") {
        const auto close = p_.find('>', i_);
        if (close == std::string_view::npos) {
          err_ = "unterminated group name";
          return {};
        }
        i_ = close + 1;
      } else if (i_ < p_.size() && p_[i_] == '?') {
        err_ = "lookaround and inline flags '(?' are not supported";
        return {};
      }
      ++depth_;
      Node n = alternation();
      --depth_;
      if (err_.empty() && (i_ >= p_.size() || p_[i_] != ')')) err_ = "missing ')'";
      ++i_;
      return n;
    }
    if (c == '[') return bracket();
    if (c == '.') {
      ++i_;
      return cls(dot(o_.dot_all));
    }
    if (c == '\\') {
      Ranges r;
      if (!escape(false, &r)) return {};
      return cls(std::move(r));
    }
    if (c == '*' || c == '+' || c == '?') {
      err_ = "nothing to repeat before '" + std::string(1, c) + "'";
      return {};
    }
    std::uint32_t cp = 0;
    if (!utf8(&cp)) return {};
    return cls({{cp, cp}});
  }

  bool utf8(std::uint32_t* cp) {
    const auto b = static_cast<unsigned char>(p_[i_]);
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + n > p_.size()) {
      err_ = "the pattern is not valid UTF-8";
      return false;
    }
    std::uint32_t v = n == 1 ? b : b & (0xFF >> (n + 1));
    for (int k = 1; k < n; ++k) v = v << 6 | (static_cast<unsigned char>(p_[i_ + k]) & 0x3F);
    i_ += static_cast<std::size_t>(n);
    *cp = v;
    return true;
  }

  bool hex(int digits, std::uint32_t* out) {
    std::uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= p_.size() || !std::isxdigit(static_cast<unsigned char>(p_[i_]))) {
        err_ = "a \\x or \\u escape needs " + std::to_string(digits) + " hex digits";
        return false;
      }
      const char h = static_cast<char>(std::tolower(static_cast<unsigned char>(p_[i_++])));
      v = v * 16 + static_cast<std::uint32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
    }
    *out = v;
    return true;
  }

  // After '\': the characters the escape stands for. In a class, \b is a backspace.
  bool escape(bool in_class, Ranges* r) {
    ++i_;
    if (i_ >= p_.size()) {
      err_ = "the pattern ends with '\\'";
      return false;
    }
    const char e = p_[i_++];
    std::uint32_t cp = 0;
    switch (e) {
      case 'd': *r = digits(); return true;
      case 'D': *r = complement(digits()); return true;
      case 'w': *r = word(); return true;
      case 'W': *r = complement(word()); return true;
      case 's': *r = spaces(); return true;
      case 'S': *r = complement(spaces()); return true;
      case 't': cp = '\t'; break;
      case 'n': cp = '\n'; break;
      case 'r': cp = '\r'; break;
      case 'f': cp = '\f'; break;
      case 'v': cp = '\v'; break;
      case '0': cp = 0; break;
      case 'x':
        if (!hex(2, &cp)) return false;
        break;
      case 'u':
        if (!hex(4, &cp)) return false;
        break;
      case 'b':
        if (!in_class) {
          err_ = "word boundaries (\\b) are not supported";
          return false;
        }
        cp = '\b';
        break;
      default:
        if (std::isalnum(static_cast<unsigned char>(e))) {
          err_ = std::string("the escape \\") + e + " is not supported";
          return false;
        }
        --i_;
        if (!utf8(&cp)) return false;
    }
    *r = {{cp, cp}};
    return true;
  }

  Node bracket() {
    ++i_;
    bool negate = false;
    if (i_ < p_.size() && p_[i_] == '^') {
      negate = true;
      ++i_;
    }
    Ranges r;
    bool first = true;
    while (true) {
      if (i_ >= p_.size()) {
        err_ = "missing ']'";
        return {};
      }
      if (p_[i_] == ']' && !first) break;
      first = false;
      Ranges one;
      if (p_[i_] == '\\') {
        if (!escape(true, &one)) return {};
      } else {
        std::uint32_t cp = 0;
        if (!utf8(&cp)) return {};
        one = {{cp, cp}};
      }
      // A range a-b between two single characters; '-' first, last or after a class is literal.
      if (one.size() == 1 && one[0].first == one[0].second && i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        Ranges hi;
        if (p_[i_] == '\\') {
          if (!escape(true, &hi)) return {};
        } else {
          std::uint32_t cp = 0;
          if (!utf8(&cp)) return {};
          hi = {{cp, cp}};
        }
        if (hi.size() != 1 || hi[0].first != hi[0].second || hi[0].first < one[0].first) {
          err_ = "a bad range in a character class";
          return {};
        }
        one = {{one[0].first, hi[0].first}};
      }
      r.insert(r.end(), one.begin(), one.end());
    }
    ++i_;
    return cls(negate ? complement(r) : std::move(r));
  }

  std::string_view p_;
  const ByteDfa::Options& o_;
  std::size_t i_ = 0;
  int depth_ = 0;
  bool end_anchor_ = false;
  std::string err_;
};

// Thompson's construction over bytes.
struct Nfa {
  struct Edge {
    unsigned char lo, hi;
    int to;
  };
  struct State {
    std::vector<Edge> edges;
    std::vector<int> eps;
  };
  std::vector<State> states;
  bool too_big = false;

  int add() {
    if (static_cast<int>(states.size()) >= kMaxNfaStates) too_big = true;
    states.emplace_back();
    return static_cast<int>(states.size()) - 1;
  }

  // A code point range as UTF-8 byte sequences (ranges of bytes, position by position) from
  // `from` to `to`: split until every position is one byte range.
  void utf8_range(std::uint32_t lo, std::uint32_t hi, int from, int to) {
    static constexpr std::uint32_t kMax[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int n = 0; n < 3; ++n) {
      if (lo <= kMax[n] && hi > kMax[n]) {
        utf8_range(lo, kMax[n], from, to);
        utf8_range(kMax[n] + 1, hi, from, to);
        return;
      }
    }
    const int len = hi <= 0x7F ? 1 : hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
    for (int i = 1; i < len; ++i) {
      const std::uint32_t m = (1u << (6 * i)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          utf8_range(lo, lo | m, from, to);
          utf8_range((lo | m) + 1, hi, from, to);
          return;
        }
        if ((hi & m) != m) {
          utf8_range(lo, (hi & ~m) - 1, from, to);
          utf8_range(hi & ~m, hi, from, to);
          return;
        }
      }
    }
    unsigned char a[4], b[4];
    encode(lo, len, a);
    encode(hi, len, b);
    int at = from;
    for (int i = 0; i < len; ++i) {
      const int next = i + 1 == len ? to : add();
      states[static_cast<std::size_t>(at)].edges.push_back({a[i], b[i], next});
      at = next;
    }
  }
  static void encode(std::uint32_t cp, int len, unsigned char* out) {
    if (len == 1) {
      out[0] = static_cast<unsigned char>(cp);
      return;
    }
    static constexpr unsigned char kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (int i = len - 1; i > 0; --i) {
      out[i] = static_cast<unsigned char>(0x80 | (cp & 0x3F));
      cp >>= 6;
    }
    out[0] = static_cast<unsigned char>(kLead[len] | cp);
  }

  // The fragment of `n` from `from`; returns its end state.
  int build(const Node& n, int from) {
    if (too_big) return from;
    switch (n.kind) {
      case Node::kClass: {
        const int to = add();
        for (auto [lo, hi] : n.ranges) utf8_range(lo, hi, from, to);
        return to;
      }
      case Node::kConcat: {
        int at = from;
        for (const auto& k : n.kids) at = build(k, at);
        return at;
      }
      case Node::kAlt: {
        const int to = add();
        for (const auto& k : n.kids) {
          const int s = add();
          states[static_cast<std::size_t>(from)].eps.push_back(s);
          const int e = build(k, s);
          states[static_cast<std::size_t>(e)].eps.push_back(to);
        }
        return to;
      }
      case Node::kRepeat: {
        int at = from;
        for (int i = 0; i < n.min && !too_big; ++i) at = build(n.kids[0], at);
        if (n.max == kUnbounded) {
          const int loop = add();
          states[static_cast<std::size_t>(at)].eps.push_back(loop);
          const int e = build(n.kids[0], loop);
          states[static_cast<std::size_t>(e)].eps.push_back(loop);
          return loop;
        }
        const int to = add();
        for (int i = n.min; i < n.max && !too_big; ++i) {
          states[static_cast<std::size_t>(at)].eps.push_back(to);
          at = build(n.kids[0], at);
        }
        states[static_cast<std::size_t>(at)].eps.push_back(to);
        return to;
      }
    }
    return from;
  }

  void closure(std::vector<int>& set, std::vector<char>& seen) const {
    for (std::size_t k = 0; k < set.size(); ++k) {
      for (int e : states[static_cast<std::size_t>(set[k])].eps) {
        if (!seen[static_cast<std::size_t>(e)]) {
          seen[static_cast<std::size_t>(e)] = 1;
          set.push_back(e);
        }
      }
    }
    std::sort(set.begin(), set.end());
  }
};

}  // namespace

Result<ByteDfa> ByteDfa::compile(std::string_view pattern, Options options) {
  Parser parser(pattern, options);
  bool start_anchor = false, end_anchor = false;
  auto ast = parser.parse(&start_anchor, &end_anchor);
  if (!ast.has_value()) return error(ast.error());
  Node whole{Node::kConcat, {}, {}, 0, 0};
  auto any = [] {
    Node r{Node::kRepeat, {}, {}, 0, kUnbounded};
    r.kids.push_back(Node{Node::kClass, {{0, kMaxCode}}, {}, 0, 0});
    r.kids[0].ranges = normalise(r.kids[0].ranges);
    return r;
  };
  if (!options.anchored && !start_anchor) whole.kids.push_back(any());
  whole.kids.push_back(std::move(*ast));
  if (!options.anchored && !end_anchor) whole.kids.push_back(any());

  Nfa nfa;
  const int start = nfa.add();
  const int accept = nfa.build(whole, start);
  if (nfa.too_big) return error(StatusCode::kInvalidArgument, "pattern: too complex (its automaton is too large)");

  // Subset construction.
  ByteDfa dfa;
  std::map<std::vector<int>, std::int32_t> ids;
  std::vector<std::vector<int>> sets;
  std::vector<char> seen(nfa.states.size(), 0);
  auto intern = [&](std::vector<int> set) -> std::int32_t {
    for (int s : set) seen[static_cast<std::size_t>(s)] = 1;
    nfa.closure(set, seen);
    for (int s : set) seen[static_cast<std::size_t>(s)] = 0;
    if (set.empty()) return kDead;
    auto [it, fresh] = ids.emplace(set, static_cast<std::int32_t>(sets.size()));
    if (fresh) sets.push_back(std::move(set));
    return it->second;
  };
  intern({start});
  std::uint64_t work = 0;
  for (std::size_t d = 0; d < sets.size(); ++d) {
    work += sets[d].size() * 8;
    if (work > kMaxWork) return error(StatusCode::kInvalidArgument, "pattern: too complex (its automaton takes too long to build)");
    if (static_cast<int>(sets.size()) > options.max_states) {
      return error(StatusCode::kInvalidArgument, "pattern: too complex (more than " + std::to_string(options.max_states) + " states)");
    }
    dfa.accept_.push_back(std::binary_search(sets[d].begin(), sets[d].end(), accept) ? 1 : 0);
    // Bytes that lead to the same NFA states share one subset computation: group by target set.
    std::vector<std::vector<int>> by_byte(256);
    for (int s : sets[d]) {
      for (const auto& e : nfa.states[static_cast<std::size_t>(s)].edges) {
        for (int b = e.lo; b <= e.hi; ++b) by_byte[static_cast<std::size_t>(b)].push_back(e.to);
        work += static_cast<std::uint64_t>(e.hi - e.lo + 1);
      }
    }
    std::map<std::vector<int>, std::int32_t> memo;
    const std::size_t row = dfa.next_.size();
    dfa.next_.resize(row + 256, kDead);
    for (int b = 0; b < 256; ++b) {
      auto& t = by_byte[static_cast<std::size_t>(b)];
      if (t.empty()) continue;
      std::sort(t.begin(), t.end());
      t.erase(std::unique(t.begin(), t.end()), t.end());
      auto it = memo.find(t);
      const std::int32_t to = it != memo.end() ? it->second : memo.emplace(t, intern(t)).first->second;
      dfa.next_[row + static_cast<std::size_t>(b)] = to;
    }
  }
  // Keep the states from which an accepting state can be reached.
  const std::size_t n = dfa.accept_.size();
  std::vector<char> live(dfa.accept_.begin(), dfa.accept_.end());
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t s = 0; s < n; ++s) {
      if (live[s]) continue;
      for (int b = 0; b < 256; ++b) {
        const auto t = dfa.next_[s * 256 + static_cast<std::size_t>(b)];
        if (t != kDead && live[static_cast<std::size_t>(t)]) {
          live[s] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  if (!live[0]) return error(StatusCode::kInvalidArgument, "pattern: matches no text");
  std::vector<std::int32_t> renumber(n, kDead);
  std::int32_t kept = 0;
  for (std::size_t s = 0; s < n; ++s) {
    if (live[s]) renumber[s] = kept++;
  }
  ByteDfa out;
  out.next_.assign(static_cast<std::size_t>(kept) * 256, kDead);
  out.accept_.assign(static_cast<std::size_t>(kept), 0);
  for (std::size_t s = 0; s < n; ++s) {
    if (!live[s]) continue;
    const auto r = static_cast<std::size_t>(renumber[s]);
    out.accept_[r] = dfa.accept_[s];
    for (std::size_t b = 0; b < 256; ++b) {
      const auto t = dfa.next_[s * 256 + b];
      out.next_[r * 256 + b] = t == kDead ? kDead : renumber[static_cast<std::size_t>(t)];
    }
  }
  // Characters to an accepting state: a 0-1 search backwards from them, where a byte that
  // begins a character costs one and a continuation byte nothing.
  const auto kept_n = static_cast<std::size_t>(kept);
  std::vector<std::vector<std::pair<std::int32_t, int>>> back(kept_n);
  for (std::size_t s = 0; s < kept_n; ++s) {
    for (std::size_t b = 0; b < 256; ++b) {
      const auto t = out.next_[s * 256 + b];
      if (t != kDead) back[static_cast<std::size_t>(t)].emplace_back(static_cast<std::int32_t>(s), (b & 0xC0) == 0x80 ? 0 : 1);
    }
  }
  out.to_accept_.assign(kept_n, UINT32_MAX);
  std::deque<std::int32_t> todo;
  for (std::size_t s = 0; s < kept_n; ++s) {
    if (out.accept_[s]) {
      out.to_accept_[s] = 0;
      todo.push_back(static_cast<std::int32_t>(s));
    }
  }
  while (!todo.empty()) {
    const auto t = static_cast<std::size_t>(todo.front());
    todo.pop_front();
    for (auto [s, w] : back[t]) {
      const std::uint32_t d = out.to_accept_[t] + static_cast<std::uint32_t>(w);
      if (d < out.to_accept_[static_cast<std::size_t>(s)]) {
        out.to_accept_[static_cast<std::size_t>(s)] = d;
        if (w == 0) {
          todo.push_front(s);
        } else {
          todo.push_back(s);
        }
      }
    }
  }
  return out;
}

bool ByteDfa::matches(std::string_view text) const {
  std::int32_t s = start();
  for (unsigned char b : text) {
    s = next(s, b);
    if (s == kDead) return false;
  }
  return accepting(s);
}

}  // namespace lmserve::text
