// text/grammar.h: the ready-made grammars, the derived fields, and the state's public calls (the
// byte machine itself is grammar_feed.cpp).
#include "text/grammar.h"

#include <algorithm>
#include <cstring>

#include "text/grammar_machine.h"

namespace lmserve::text {
namespace {

using namespace grammar_detail;
using Kind = GrammarNode::Kind;
using Frame = GrammarState::Frame;

}  // namespace

Status Grammar::finish() {
  // The nodes behind kAny: a free object, an array of anything, a string, a number, the literals.
  // A free object's keys are any strings: it needs them too.
  bool has_any = false;
  for (const auto& n : nodes) {
    has_any |= n.kind == Kind::kAny || (n.kind == Kind::kObject && n.properties.empty()) || (n.kind == Kind::kArray && n.item < 0);
  }
  if (has_any && any_value < 0) {
    any_value = add(GrammarNode{.kind = Kind::kAny});
    any_object = add(GrammarNode{.kind = Kind::kObject});
    any_array = add(GrammarNode{.kind = Kind::kArray});
    any_string = add(GrammarNode{.kind = Kind::kString});
    any_number = add(GrammarNode{.kind = Kind::kNumber});
    any_literal = add(GrammarNode{.kind = Kind::kLiterals, .literals = {"false", "null", "true"}});
  }
  for (auto& n : nodes) {
    if (n.kind == Kind::kObject) {
      if (n.properties.empty() && n.extra < 0) n.extra = any_value;
      n.next_required.assign(n.properties.size() + 1, static_cast<std::uint32_t>(n.properties.size()));
      for (std::size_t i = n.properties.size(); i-- > 0;) {
        n.next_required[i] = n.properties[i].required ? static_cast<std::uint32_t>(i) : n.next_required[i + 1];
      }
    }
    if (n.kind == Kind::kArray && n.item < 0) n.item = any_value;
    if (n.kind == Kind::kString && n.dfa < 0) n.nullable = false;
    if (n.kind == Kind::kLiterals) {
      std::sort(n.literals.begin(), n.literals.end());
      n.literals.erase(std::unique(n.literals.begin(), n.literals.end()), n.literals.end());
    }
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (auto& n : nodes) {
      bool v = false;
      switch (n.kind) {
        case Kind::kSeq:
          v = std::all_of(n.children.begin(), n.children.end(), [&](std::int32_t c) { return nodes[static_cast<std::size_t>(c)].nullable; });
          break;
        case Kind::kAlt:
          v = std::any_of(n.children.begin(), n.children.end(), [&](std::int32_t c) { return nodes[static_cast<std::size_t>(c)].nullable; });
          break;
        case Kind::kRepeat:
          v = n.min == 0 || n.max == 0 || nodes[static_cast<std::size_t>(n.item)].nullable;
          break;
        case Kind::kRegex:
          v = dfas[static_cast<std::size_t>(n.dfa)].accepting(0);
          break;
        default:
          break;
      }
      if (v != n.nullable) {
        n.nullable = v;
        changed = true;
      }
    }
  }
  // A node that can come back to itself before any byte is read would never end (a $ref cycle
  // through anyOf with nothing written between, a repetition of what may be empty): refused.
  // The start edges: an alternative's children, a sequence's children up to the first one that
  // must read a byte, a repetition's item; every other kind reads its first byte itself.
  std::vector<std::uint8_t> color(nodes.size(), 0);  // 0 unseen, 1 on the path, 2 done
  std::vector<std::pair<std::int32_t, std::size_t>> stack;
  auto starts = [&](std::int32_t id, std::size_t k) -> std::int32_t {
    const GrammarNode& n = nodes[static_cast<std::size_t>(id)];
    if (n.kind == Kind::kAlt) return k < n.children.size() ? n.children[k] : -1;
    if (n.kind == Kind::kSeq) {
      if (k >= n.children.size()) return -1;
      for (std::size_t i = 0; i < k; ++i) {
        if (!nodes[static_cast<std::size_t>(n.children[i])].nullable) return -1;
      }
      return n.children[k];
    }
    if (n.kind == Kind::kRepeat) return k == 0 ? n.item : -1;
    return -1;
  };
  for (std::size_t s = 0; s < nodes.size(); ++s) {
    if (color[s] != 0) continue;
    stack.emplace_back(static_cast<std::int32_t>(s), 0);
    color[s] = 1;
    while (!stack.empty()) {
      auto& [id, k] = stack.back();
      const std::int32_t next = starts(id, k++);
      if (next < 0) {
        if (k > nodes[static_cast<std::size_t>(id)].children.size() + 1) {
          color[static_cast<std::size_t>(id)] = 2;
          stack.pop_back();
        }
        continue;
      }
      if (color[static_cast<std::size_t>(next)] == 1) {
        return Status(StatusCode::kInvalidArgument, "the grammar can come back to the same place without writing anything (a $ref cycle)");
      }
      if (color[static_cast<std::size_t>(next)] == 0) {
        color[static_cast<std::size_t>(next)] = 1;
        stack.emplace_back(next, 0);
      }
    }
  }
  for (const auto& n : nodes) {
    if (n.kind == Kind::kRepeat && n.item >= 0 && nodes[static_cast<std::size_t>(n.item)].nullable && n.max == UINT32_MAX) {
      return Status(StatusCode::kInvalidArgument, "a repetition of something that may be empty");
    }
  }
  // A frame names its node in 16 bits and counts a literal's or key's bytes in 16.
  if (nodes.size() > 65535) return Status(StatusCode::kInvalidArgument, "the grammar is too large (more than 65,535 nodes)");
  for (const auto& n : nodes) {
    for (const auto& l : n.literals) {
      if (l.size() > 65535) return Status(StatusCode::kInvalidArgument, "a literal of more than 65,535 bytes");
    }
    for (const auto& p : n.properties) {
      if (p.key.size() > 65535) return Status(StatusCode::kInvalidArgument, "a property name of more than 65,535 bytes");
    }
  }
  return Status::ok();
}

std::shared_ptr<const Grammar> Grammar::json_object() {
  static const std::shared_ptr<const Grammar> g = [] {
    auto m = std::make_shared<Grammar>();
    m->root = m->add(GrammarNode{.kind = Kind::kAny, .object_only = true});
    (void)m->finish();  // two nodes and three short literals
    return m;
  }();
  return g;
}

Result<std::shared_ptr<const Grammar>> Grammar::regex(std::string_view pattern) {
  auto dfa = ByteDfa::compile(pattern, ByteDfa::Options{.anchored = true, .dot_all = false});
  if (!dfa.has_value()) return error(dfa.error());
  auto m = std::make_shared<Grammar>();
  m->dfas.push_back(std::move(*dfa));
  m->root = m->add(GrammarNode{.kind = Kind::kRegex, .dfa = 0});
  LMSERVE_RETURN_IF_ERROR(m->finish());
  return std::shared_ptr<const Grammar>(std::move(m));
}

Result<std::shared_ptr<const Grammar>> Grammar::choice(const std::vector<std::string>& choices) {
  if (choices.empty()) return error(StatusCode::kInvalidArgument, "guided_choice: needs at least one choice");
  for (const auto& c : choices) {
    if (c.empty()) return error(StatusCode::kInvalidArgument, "guided_choice: a choice is empty");
  }
  auto m = std::make_shared<Grammar>();
  m->root = m->add(GrammarNode{.kind = Kind::kLiterals, .literals = choices});
  if (Status st = m->finish(); !st.is_ok()) return error(StatusCode::kInvalidArgument, "guided_choice: " + st.message());
  return std::shared_ptr<const Grammar>(std::move(m));
}

GrammarState::GrammarState(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)), raw_(g_.get()) {
  frames_[0] = start_frame(raw_->root);
  used_ = 1;
  threads_ = 1;
  end_[0] = 1;
}

void GrammarState::copy_from(const GrammarState& o) {
  if (raw_ != o.raw_) {
    g_ = o.g_;
    raw_ = o.raw_;
  }
  threads_ = o.threads_;
  used_ = o.used_;
  end_ = o.end_;
  std::memcpy(frames_.data(), o.frames_.data(), sizeof(Frame) * o.used_);
}

bool GrammarState::advance_into(unsigned char b, GrammarState& out) const {
  if (out.raw_ != raw_) {
    out.g_ = g_;
    out.raw_ = raw_;
  }
  out.threads_ = 0;
  out.used_ = 0;
  Out sink{out};
  Frame st[kMaxFrames];
  for (int t = 0; t < threads_; ++t) {
    const int begin = t == 0 ? 0 : end_[static_cast<std::size_t>(t - 1)], n = end_[static_cast<std::size_t>(t)] - begin;
    std::memcpy(st, &frames_[static_cast<std::size_t>(begin)], sizeof(Frame) * static_cast<std::size_t>(n));
    feed(st, n, b, sink);
  }
  return out.threads_ > 0;
}

bool GrammarState::advance(unsigned char b) {
  GrammarState next;
  if (!advance_into(b, next)) return false;
  *this = next;
  return true;
}

bool GrammarState::advance(std::string_view bytes) {
  GrammarState cur = *this, next;
  for (unsigned char b : bytes) {
    if (!cur.advance_into(b, next)) return false;
    cur = next;
  }
  *this = cur;
  return true;
}

bool GrammarState::thread_complete(const Frame* frames, int n) const {
  Frame st[kMaxFrames];
  std::memcpy(st, frames, sizeof(Frame) * static_cast<std::size_t>(n));
  while (n > 0) {
    if (!can_end(st[n - 1])) return false;
    --n;
    if (n > 0) child_done(st[n - 1]);
  }
  return true;
}

bool GrammarState::complete() const {
  for (int t = 0; t < threads_; ++t) {
    const int begin = t == 0 ? 0 : end_[static_cast<std::size_t>(t - 1)];
    if (thread_complete(&frames_[static_cast<std::size_t>(begin)], end_[static_cast<std::size_t>(t)] - begin)) return true;
  }
  return false;
}

bool GrammarState::finished() const {
  if (!complete()) return false;
  GrammarState next;
  for (int b = 0; b < 256; ++b) {
    if (advance_into(static_cast<unsigned char>(b), next)) return false;
  }
  return true;
}

std::string GrammarState::key(std::size_t longest) const {
  std::string k;
  k.resize(1 + threads_ + sizeof(Frame) * used_);
  k[0] = static_cast<char>(threads_);
  std::memcpy(k.data() + 1, end_.data(), threads_);
  const auto L = static_cast<std::uint32_t>(std::min<std::size_t>(longest, 65535));
  for (std::size_t i = 0; i < used_; ++i) {
    Frame f = frames_[i];
    const GrammarNode& n = raw_->nodes[f.node];
    if (n.kind == Kind::kString && (n.min > 0 || n.max != UINT32_MAX)) {
      // What is left of the limits, as far as a token can reach.
      const std::uint32_t to_min = n.min > f.b ? n.min - f.b : 0, to_max = n.max - f.b;
      f.b = std::min(to_min, L) << 16 | std::min(to_max, L);
    }
    std::memcpy(k.data() + 1 + threads_ + i * sizeof(Frame), &f, sizeof(Frame));
  }
  return k;
}

int GrammarState::plain_string(std::uint32_t* room) const {
  if (threads_ != 1 || used_ == 0) return -1;
  const Frame& f = frames_[used_ - 1u];
  const GrammarNode& n = raw_->nodes[f.node];
  if (n.kind != Kind::kString || f.phase != kStrIn || n.dfa >= 0) return -1;
  *room = n.max == UINT32_MAX ? UINT32_MAX : n.max - f.b;
  const int left = f.d & 3, code = f.d >> 2;
  switch (left) {
    case 0: return 0;
    case 1: return 1;
    case 2: return code == 1 ? 4 : code == 2 ? 5 : 2;
    default: return code == 3 ? 6 : code == 4 ? 7 : 3;
  }
}

}  // namespace lmserve::text
