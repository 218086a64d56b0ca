// The byte machine of text/grammar.h: a byte fed through one thread's frames (feed), and the
// frames' starts, ends and children's ends.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "text/grammar_machine.h"

namespace lmserve::text {
namespace {

using namespace grammar_detail;

using Kind = GrammarNode::Kind;
using Frame = GrammarState::Frame;

bool is_space(unsigned char b) { return b == ' ' || b == '\n' || b == '\r' || b == '\t'; }
bool is_digit(unsigned char b) { return b >= '0' && b <= '9'; }
int hex_value(unsigned char b) {
  if (is_digit(b)) return b - '0';
  if (b >= 'a' && b <= 'f') return b - 'a' + 10;
  if (b >= 'A' && b <= 'F') return b - 'A' + 10;
  return -1;
}

constexpr int kMaxNumberDigits = 16;  // integer and fraction digits each: exact in a double
constexpr int kMaxExponentDigits = 3;

// The range of a UTF-8 continuation byte, by the code kept in a string frame's `d`.
constexpr unsigned char kContLo[] = {0x80, 0xA0, 0x80, 0x90, 0x80};
constexpr unsigned char kContHi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};

double number_value(const Frame& f) {
  double v;
  const std::uint64_t bits = std::uint64_t{f.a} << 32 | f.b;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
void set_number_value(Frame& f, double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof v);
  f.a = static_cast<std::uint32_t>(bits >> 32);
  f.b = static_cast<std::uint32_t>(bits);
}

bool bounded(const GrammarNode& n) { return n.has_lo || n.has_hi; }

// Whether some value in [lo, hi] (of the magnitudes a number prefix may still become, signed
// by `negative`) meets the node's bounds; integers need an integer there.
bool meets(const GrammarNode& n, bool negative, double lo, double hi) {
  double a = negative ? -hi : lo, b = negative ? -lo : hi;
  if (n.integer) {
    double lo_i = -std::numeric_limits<double>::infinity(), hi_i = std::numeric_limits<double>::infinity();
    if (n.has_lo) lo_i = n.lo_exclusive ? std::floor(n.lo) + 1 : std::ceil(n.lo);
    if (n.has_hi) hi_i = n.hi_exclusive ? std::ceil(n.hi) - 1 : std::floor(n.hi);
    return std::max(std::ceil(a), lo_i) <= std::min(std::floor(b), hi_i);
  }
  if (n.has_lo && (n.lo_exclusive ? b <= n.lo : b < n.lo)) return false;
  if (n.has_hi && (n.hi_exclusive ? a >= n.hi : a > n.hi)) return false;
  return true;
}

// Whether a number frame's prefix (after its latest digit) can still end within the bounds. The
// magnitudes it may become are [v, v + 1) and so on: an open end is the double just below it.
bool number_viable(const GrammarNode& n, const Frame& f) {
  if (!bounded(n)) return true;
  const bool neg = f.d != 0;
  const double v = number_value(f);
  auto below = [](double x) { return std::nextafter(x, -std::numeric_limits<double>::infinity()); };
  switch (f.phase) {
    case kNumMinus:
      return meets(n, true, 0, std::numeric_limits<double>::infinity());
    case kNumZero:
      return meets(n, neg, 0, n.integer ? 0 : below(1));
    case kNumInt: {
      if (meets(n, neg, v, n.integer ? v : below(v + 1))) return true;
      double scale = 1;
      for (int j = f.c; j < kMaxNumberDigits; ++j) {
        scale *= 10;
        if (meets(n, neg, v * scale, n.integer ? (v + 1) * scale - 1 : below((v + 1) * scale))) return true;
      }
      return false;
    }
    case kNumDot:
      return meets(n, neg, v, below(v + 1));
    case kNumFrac:
      return meets(n, neg, v, f.e >= kMaxNumberDigits ? v : below(v + std::pow(10.0, -f.e)));
    default:
      return true;
  }
}

bool number_in_bounds(const GrammarNode& n, const Frame& f) {
  if (!bounded(n)) return true;
  const double v = (f.d ? -1 : 1) * number_value(f);
  if (n.has_lo && (n.lo_exclusive ? v <= n.lo : v < n.lo)) return false;
  if (n.has_hi && (n.hi_exclusive ? v >= n.hi : v > n.hi)) return false;
  return true;
}

}  // namespace

GrammarState::Frame GrammarState::start_frame(std::int32_t node) const {
  Frame f{};
  f.node = static_cast<std::uint16_t>(node);
  return f;
}

void GrammarState::child_done(Frame& f) const {
  const GrammarNode& n = raw_->nodes[f.node];
  switch (n.kind) {
    case Kind::kObject:
      if (f.phase == kObjInKey) {
        f.phase = kObjColon;
      } else {
        f.phase = kObjAfterValue;
        if (!n.properties.empty()) f.a = f.b + 1;
      }
      f.ws = 0;
      break;
    case Kind::kArray:
      ++f.a;
      f.phase = kArrAfter;
      f.ws = 0;
      break;
    case Kind::kRepeat:
      if (f.phase == kRepInSep) {
        f.phase = kRepNeedItem;
      } else {
        ++f.a;
        f.phase = kRepAfter;
      }
      break;
    default:  // kSeq moved on when it pushed the child
      break;
  }
}

bool GrammarState::can_end(const Frame& f) const {
  const GrammarNode& n = raw_->nodes[f.node];
  switch (n.kind) {
    case Kind::kNumber:
      return (f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac || f.phase == kNumExp) && number_in_bounds(n, f);
    case Kind::kLiterals:
      return f.c > 0 && f.c == n.literals[f.a].size();
    case Kind::kRegex:
      return raw_->dfas[static_cast<std::size_t>(n.dfa)].accepting(static_cast<std::int32_t>(f.a));
    case Kind::kSeq:
      for (std::size_t i = f.a; i < n.children.size(); ++i) {
        if (!raw_->nodes[static_cast<std::size_t>(n.children[i])].nullable) return false;
      }
      return true;
    case Kind::kAlt:
      return n.nullable;
    case Kind::kRepeat:
      return (f.phase == kRepStart && (n.min == 0 || n.max == 0)) || (f.phase == kRepAfter && f.a >= n.min);
    default:
      return false;
  }
}

// Feeds `b` to the thread st[0..n) (a scratch copy the call may change); each way the thread
// goes on is added to `out`. Frames that may end and do not take `b` give it to their parent.
void GrammarState::feed(Frame* st, int n, unsigned char b, Out& out) const {
  const Grammar& g = *raw_;
  const int max_depth = std::min(g.limits.max_depth, kMaxFrames);
  // Another way for the thread: a copy goes its own way from here.
  auto fork = [&](auto&& change) {
    Frame copy[kMaxFrames];
    std::memcpy(copy, st, sizeof(Frame) * static_cast<std::size_t>(n));
    int m = n;
    if (change(copy, m)) feed(copy, m, b, out);
  };
  // The top frame may end here as well as go on: a copy pops it and gives `b` to its parent.
  auto end_here_too = [&] {
    fork([&](Frame* c, int& m) {
      if (--m == 0) return false;
      child_done(c[m - 1]);
      return true;
    });
  };
  auto space = [&](Frame& f) {
    if (!is_space(b) || f.ws >= g.limits.max_space_run) return false;
    ++f.ws;
    return true;
  };
  while (n > 0) {
    Frame& f = st[n - 1];
    const GrammarNode& node = g.nodes[f.node];
    // The frame ends without taking `b`, which goes to its parent.
    auto pop = [&] {
      --n;
      if (n > 0) child_done(st[n - 1]);
    };
    // The frame took `b`: the thread goes on as it is.
    auto take = [&] { out.add(st, n); };
    // The frame took `b` and is whole.
    auto take_last = [&] {
      pop();
      out.add(st, n);
    };
    auto push = [&](std::int32_t child) {
      if (n >= max_depth) return false;
      st[n++] = start_frame(child);
      return true;
    };
    switch (node.kind) {
      case Kind::kAny: {
        std::int32_t to = -1;
        if (b == '{') {
          to = g.any_object;
        } else if (!node.object_only) {
          if (b == '[') to = g.any_array;
          if (b == '"') to = g.any_string;
          if (b == '-' || is_digit(b)) to = g.any_number;
          if (b == 't' || b == 'f' || b == 'n') to = g.any_literal;
        }
        if (to < 0) return;
        f = start_frame(to);
        continue;
      }
      case Kind::kAlt: {
        for (std::size_t i = 0; i + 1 < node.children.size(); ++i) {
          fork([&](Frame* c, int m) {
            c[m - 1] = start_frame(node.children[i]);
            return true;
          });
        }
        if (node.children.empty()) return;
        f = start_frame(node.children.back());
        continue;
      }
      case Kind::kSeq: {
        if (f.a >= node.children.size()) {
          pop();
          continue;
        }
        const std::int32_t child = node.children[f.a];
        if (g.nodes[static_cast<std::size_t>(child)].nullable) {
          fork([&](Frame* c, int) {
            ++c[n - 1].a;  // the child left out
            return true;
          });
        }
        ++f.a;
        if (!push(child)) return;
        continue;
      }
      case Kind::kRepeat: {
        const bool may_end = can_end(f);
        if (f.phase == kRepStart || f.phase == kRepAfter || f.phase == kRepNeedItem) {
          if (may_end) end_here_too();
          if (f.a >= node.max) return;
          if (f.phase == kRepAfter && node.separator >= 0) {
            f.phase = kRepInSep;
            if (!push(node.separator)) return;
          } else {
            f.phase = kRepInItem;
            if (!push(node.item)) return;
          }
          continue;
        }
        return;  // an item or separator is running above: never here
      }
      case Kind::kLiterals: {
        const auto& lits = node.literals;
        const std::string& cur = lits[f.a];
        std::size_t found = lits.size();
        for (std::size_t j = f.a; j < lits.size() && lits[j].size() >= f.c && lits[j].compare(0, f.c, cur, 0, f.c) == 0; ++j) {
          if (lits[j].size() > f.c && static_cast<unsigned char>(lits[j][f.c]) == b) {
            found = j;
            break;
          }
        }
        if (found == lits.size()) {
          if (!can_end(f)) return;
          pop();
          continue;
        }
        if (can_end(f)) end_here_too();  // a whole literal that a longer one extends
        f.a = static_cast<std::uint32_t>(found);
        ++f.c;
        const bool longer = found + 1 < lits.size() && lits[found + 1].size() > f.c && lits[found + 1].compare(0, f.c, lits[found], 0, f.c) == 0;
        if (f.c == lits[found].size() && !longer) {
          take_last();
        } else {
          take();
        }
        return;
      }
      case Kind::kRegex: {
        const ByteDfa& dfa = g.dfas[static_cast<std::size_t>(node.dfa)];
        const std::int32_t t = dfa.next(static_cast<std::int32_t>(f.a), b);
        if (dfa.accepting(static_cast<std::int32_t>(f.a))) end_here_too();
        if (t == ByteDfa::kDead) return;
        f.a = static_cast<std::uint32_t>(t);
        take();
        return;
      }
      case Kind::kObject: {
        const bool named = !node.properties.empty();
        const auto size = static_cast<std::uint32_t>(node.properties.size());
        auto key_start = [&] {
          if (b != '"') return false;
          if (!named) {
            f.phase = kObjInKey;
            return push(g.any_string);
          }
          if (f.a >= size) return false;
          f.phase = kObjKey;
          f.b = f.a;
          f.c = 1;
          take();
          return false;
        };
        switch (f.phase) {
          case kObjOpen:
            if (b != '{') return;
            f.phase = kObjFirst;
            f.ws = 0;
            take();
            return;
          case kObjFirst:
          case kObjKeyNext:
            if (space(f)) return take();
            if (b == '}' && f.phase == kObjFirst && (!named || node.next_required[0] == size)) return take_last();
            f.ws = 0;
            if (!key_start()) return;
            continue;  // a free key's string frame takes the quote
          case kObjKey: {
            const std::string& cur = node.properties[f.b].key;
            const std::uint32_t last = std::min(node.next_required[f.a], size - 1);
            for (std::uint32_t j = f.b; j <= last; ++j) {
              const std::string& k = node.properties[j].key;
              if (k.size() > f.c && static_cast<unsigned char>(k[f.c]) == b && k.compare(0, f.c, cur, 0, f.c) == 0) {
                f.b = j;
                ++f.c;
                if (f.c == k.size()) {
                  f.phase = kObjColon;
                  f.ws = 0;
                }
                return take();
              }
            }
            return;
          }
          case kObjColon:
            if (space(f)) return take();
            if (b != ':') return;
            f.phase = kObjBeforeValue;
            f.ws = 0;
            return take();
          case kObjBeforeValue:
            if (space(f)) return take();
            f.ws = 0;
            f.phase = kObjInValue;
            if (!push(named ? node.properties[f.b].value : node.extra)) return;
            continue;
          case kObjAfterValue:
            if (space(f)) return take();
            if (b == ',' && (!named || f.a < size)) {
              f.phase = kObjKeyNext;
              f.ws = 0;
              return take();
            }
            if (b == '}' && (!named || node.next_required[f.a] == size)) return take_last();
            return;
          default:
            return;
        }
      }
      case Kind::kArray:
        switch (f.phase) {
          case kArrOpen:
            if (b != '[') return;
            f.phase = kArrFirst;
            f.ws = 0;
            return take();
          case kArrFirst:
          case kArrNext:
            if (space(f)) return take();
            if (b == ']' && f.phase == kArrFirst && node.min == 0) return take_last();
            if (f.a >= node.max) return;
            f.ws = 0;
            f.phase = kArrInItem;
            if (!push(node.item)) return;
            continue;
          case kArrAfter:
            if (space(f)) return take();
            if (b == ',' && f.a < node.max) {
              f.phase = kArrNext;
              f.ws = 0;
              return take();
            }
            if (b == ']' && f.a >= node.min) return take_last();
            return;
          default:
            return;
        }
      case Kind::kString: {
        const ByteDfa* dfa = node.dfa >= 0 ? &g.dfas[static_cast<std::size_t>(node.dfa)] : nullptr;
        const bool counted = node.min > 0 || node.max != UINT32_MAX;
        auto feed_dfa = [&](unsigned char x) {
          if (!dfa) return true;
          const std::int32_t t = dfa->next(static_cast<std::int32_t>(f.a), x);
          if (t == ByteDfa::kDead) return false;
          f.a = static_cast<std::uint32_t>(t);
          return true;
        };
        // One more character, if the length allows it and (with a pattern) the pattern can
        // still end within the length left.
        auto one_more = [&] {
          if (!counted) return true;
          if (f.b >= node.max) return false;
          ++f.b;
          return !dfa || node.max == UINT32_MAX || dfa->chars_to_accept(static_cast<std::int32_t>(f.a)) <= node.max - f.b;
        };
        switch (f.phase) {
          case kStrOpen:
            if (b != '"') return;
            f.phase = kStrIn;
            return take();
          case kStrIn: {
            const int left = f.d & 3;
            if (left > 0) {
              const int code = f.d >> 2;
              if (b < kContLo[code] || b > kContHi[code] || !feed_dfa(b)) return;
              f.d = static_cast<std::uint8_t>(left - 1);
              return take();
            }
            if (b == '"') {
              if ((counted && f.b < node.min) || (dfa && !dfa->accepting(static_cast<std::int32_t>(f.a)))) return;
              return take_last();
            }
            if (b == '\\') {
              if (counted && f.b >= node.max) return;
              if (dfa) {  // only when some escape's character may come next: no dead end
                bool any = false;
                for (unsigned char x : {'"', '\\', '/', '\b', '\f', '\n', '\r', '\t'}) {
                  const std::int32_t t = dfa->next(static_cast<std::int32_t>(f.a), x);
                  any |= t != ByteDfa::kDead && (!counted || node.max == UINT32_MAX || dfa->chars_to_accept(t) <= node.max - f.b - 1);
                }
                if (!any) return;
              }
              f.phase = kStrEscape;
              return take();
            }
            if (b < 0x20) return;
            int more = 0, code = 0;
            if (b < 0x80) {
              more = 0;
            } else if (b >= 0xC2 && b <= 0xDF) {
              more = 1;
            } else if (b >= 0xE0 && b <= 0xEF) {
              more = 2;
              code = b == 0xE0 ? 1 : b == 0xED ? 2 : 0;
            } else if (b >= 0xF0 && b <= 0xF4) {
              more = 3;
              code = b == 0xF0 ? 3 : b == 0xF4 ? 4 : 0;
            } else {
              return;
            }
            if (!feed_dfa(b) || !one_more()) return;
            f.d = static_cast<std::uint8_t>(more | code << 2);
            return take();
          }
          case kStrEscape: {
            unsigned char decoded = 0;
            switch (b) {
              case '"': decoded = '"'; break;
              case '\\': decoded = '\\'; break;
              case '/': decoded = '/'; break;
              case 'b': decoded = '\b'; break;
              case 'f': decoded = '\f'; break;
              case 'n': decoded = '\n'; break;
              case 'r': decoded = '\r'; break;
              case 't': decoded = '\t'; break;
              case 'u':
                if (dfa) return;  // a pattern's characters are written as themselves
                f.phase = kStrHex;
                f.e = 4;
                f.c = 0;
                return take();
              default:
                return;
            }
            if (!feed_dfa(decoded) || !one_more()) return;
            f.phase = kStrIn;
            return take();
          }
          case kStrHex: {
            const int v = hex_value(b);
            if (v < 0) return;
            if (f.e == 3 && f.c == 0xD && v >= 8) return;  // a surrogate half: refused
            f.c = static_cast<std::uint16_t>(f.c * 16 + v);
            if (--f.e == 0) {
              f.c = 0;
              if (!one_more()) return;
              f.phase = kStrIn;
            }
            return take();
          }
          default:
            return;
        }
      }
      case Kind::kNumber: {
        const bool bounds = bounded(node);
        auto digit = [&](std::uint8_t phase) {
          Frame next = f;
          next.phase = phase;
          const double dv = b - '0';
          if (phase == kNumFrac) {
            if (next.e >= kMaxNumberDigits) return false;
            ++next.e;
            if (bounds) set_number_value(next, number_value(f) + dv * std::pow(10.0, -next.e));
          } else if (phase == kNumExp) {
            if (next.ws >= kMaxExponentDigits) return false;
            ++next.ws;
          } else {
            if (next.c >= kMaxNumberDigits) return false;
            ++next.c;
            if (bounds) set_number_value(next, number_value(f) * 10 + dv);
          }
          if (!number_viable(node, next)) return false;
          f = next;
          take();
          return true;
        };
        auto end_here = [&] {
          if (!can_end(f)) return false;
          pop();
          return true;
        };
        switch (f.phase) {
          case kNumStart:
          case kNumMinus:
            if (b == '-' && f.phase == kNumStart) {
              Frame next = f;
              next.phase = kNumMinus;
              next.d = 1;
              if (!number_viable(node, next)) return;
              f = next;
              return take();
            }
            if (b == '0') {
              digit(kNumZero);
              return;
            }
            if (b >= '1' && b <= '9') digit(kNumInt);
            return;
          case kNumZero:
          case kNumInt:
          case kNumFrac:
            if (is_digit(b) && f.phase != kNumZero) {
              digit(f.phase);
              return;
            }
            if (b == '.' && f.phase != kNumFrac && !node.integer) {
              Frame next = f;
              next.phase = kNumDot;
              if (!number_viable(node, next)) return;
              f = next;
              return take();
            }
            if ((b == 'e' || b == 'E') && !node.integer && !bounds) {
              f.phase = kNumE;
              return take();
            }
            if (!end_here()) return;
            continue;
          case kNumDot:
            if (is_digit(b)) digit(kNumFrac);
            return;
          case kNumE:
            if (b == '+' || b == '-') {
              f.phase = kNumESign;
              return take();
            }
            if (is_digit(b)) digit(kNumExp);
            return;
          case kNumESign:
            if (is_digit(b)) digit(kNumExp);
            return;
          case kNumExp:
            if (is_digit(b)) {
              digit(kNumExp);
              return;
            }
            if (!end_here()) return;
            continue;
          default:
            return;
        }
      }
    }
    return;
  }
}

}  // namespace lmserve::text
