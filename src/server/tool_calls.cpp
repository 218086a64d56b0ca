#include "server/tool_calls.h"

#include <nlohmann/json.hpp>
#include <random>

#include "text/json_schema.h"

namespace lmserve::server {

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::size_t kNone = std::string::npos;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::size_t skip_space(std::string_view s, std::size_t i = 0) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

// The length of the longest end of `s` that begins `marker` (and is not all of it).
std::size_t partial_marker(std::string_view s, std::string_view marker) {
  for (std::size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k) {
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  }
  return 0;
}

bool is_arguments_key(const std::string& k) { return k == "arguments" || k == "parameters"; }

}  // namespace

std::optional<ToolParser> tool_parser_named(std::string_view name) {
  if (name == "hermes") return ToolParser::kHermes;
  if (name == "llama3_json") return ToolParser::kLlama3Json;
  if (name == "mistral") return ToolParser::kMistral;
  return std::nullopt;
}

std::string make_tool_call_id(ToolParser p) {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int> pick(0, 61);
  const int n = p == ToolParser::kMistral ? 9 : 24;
  std::string id = p == ToolParser::kMistral ? "" : "call_";
  for (int i = 0; i < n; ++i) id += kAlnum[pick(rng)];
  return id;
}

ToolStreamDelta ToolCallStream::feed(std::string_view text) {
  ToolStreamDelta out;
  pending_.append(text);
  step(out);
  return out;
}

void ToolCallStream::start_call() {
  obj_.clear();
  depth_ = 0;
  in_string_ = escape_ = false;
  phase_ = Phase::kKey;
  key_.clear();
  value_begin_ = kNone;
  args_streaming_ = args_done_ = args_from_string_ = false;
  args_begin_ = args_sent_ = args_end_ = 0;
  name_.clear();
  args_text_.clear();
  name_sent_ = false;
  open_call_ = true;
  state_ = State::kCall;
}

// Decides as much of pending_ as can be decided now.
void ToolCallStream::step(ToolStreamDelta& out) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        if (parser_ != ToolParser::kLlama3Json) {
          state_ = State::kContent;
          break;
        }
        // Llama: a call only as the whole output (after space), or after <|python_tag|>.
        const std::size_t i = skip_space(pending_);
        if (i == pending_.size()) return;  // only space so far
        const std::string_view rest = std::string_view(pending_).substr(i);
        if (rest.starts_with(kPythonTag) || rest.front() == '{') {
          const std::size_t n = rest.front() == '{' ? i : i + kPythonTag.size();
          marker_ += pending_.substr(0, n);
          pending_.erase(0, n);
          start_call();
          break;
        }
        if (kPythonTag.starts_with(rest)) return;  // may still be the tag
        state_ = State::kText;
        break;
      }
      case State::kText:
        out.content += pending_;
        pending_.clear();
        return;
      case State::kContent: {
        const std::string_view open = parser_ == ToolParser::kHermes ? kHermesOpen : kMistralOpen;
        const auto at = pending_.find(open);
        if (at == kNone) {
          const std::size_t held = partial_marker(pending_, open);
          out.content += pending_.substr(0, pending_.size() - held);
          pending_.erase(0, pending_.size() - held);
          return;
        }
        out.content += pending_.substr(0, at);
        marker_ = std::string(open);
        pending_.erase(0, at + open.size());
        if (parser_ == ToolParser::kHermes) {
          start_call();
        } else {
          in_array_ = false;
          state_ = State::kAfterCall;  // the array's '[' next
        }
        break;
      }
      case State::kCall:
        if (!scan_call(out)) return;
        break;
      case State::kAfterCall: {
        const std::size_t i = skip_space(pending_);
        if (i == pending_.size()) return;
        const std::string_view rest = std::string_view(pending_).substr(i);
        if (parser_ == ToolParser::kHermes) {
          if (rest.starts_with(kHermesClose)) {
            pending_.erase(0, i + kHermesClose.size());
            state_ = State::kContent;
          } else if (kHermesClose.starts_with(rest)) {
            return;
          } else {
            state_ = State::kContent;  // no closing tag: what follows is content
          }
          break;
        }
        if (parser_ == ToolParser::kLlama3Json) {
          if (rest.front() == ';') {
            pending_.erase(0, i + 1);
            marker_.clear();
            state_ = State::kStart;  // the next call
          } else {
            state_ = State::kText;
          }
          break;
        }
        // Mistral: [ {call} , {call} ]
        if (!in_array_) {
          if (rest.front() != '[') {
            ++malformed_;
            state_ = State::kText;
            break;
          }
          in_array_ = true;
          pending_.erase(0, i + 1);
          marker_ += "[";
          start_call();
          break;
        }
        if (rest.front() == ',') {
          pending_.erase(0, i + 1);
          marker_.clear();
          start_call();
        } else if (rest.front() == ']') {
          pending_.erase(0, i + 1);
          in_array_ = false;
          state_ = State::kContent;
        } else {
          ++malformed_;
          state_ = State::kText;
        }
        break;
      }
    }
  }
}

ToolCallDelta& ToolCallStream::delta_of_current(ToolStreamDelta& out) {
  const int index = next_index_ - 1;
  if (out.calls.empty() || out.calls.back().index != index) out.calls.push_back({.index = index});
  return out.calls.back();
}

void ToolCallStream::emit_name(ToolStreamDelta& out) {
  if (name_sent_) return;
  name_sent_ = true;
  ++next_index_;
  auto& d = delta_of_current(out);
  d.id = make_tool_call_id(parser_);
  d.name = name_;
  // Arguments scanned before the name: out now.
  if (args_done_) {
    d.arguments = args_from_string_ ? args_text_ : obj_.substr(args_begin_, args_end_ - args_begin_);
  } else if (args_streaming_) {
    d.arguments = obj_.substr(args_begin_);
    args_sent_ = obj_.size();
  }
}

// A value of the call's object ended at `end` (exclusive).
void ToolCallStream::value_done(ToolStreamDelta& out, std::size_t end) {
  const std::string raw = obj_.substr(value_begin_, end - value_begin_);
  if (key_ == "name") {
    const auto j = nlohmann::json::parse(raw, nullptr, false);
    if (j.is_string() && name_.empty()) {
      name_ = j.get<std::string>();
      emit_name(out);
    }
  } else if (is_arguments_key(key_) && !args_done_) {
    if (args_streaming_) {
      args_streaming_ = false;
      args_done_ = true;
      args_end_ = end;
      if (name_sent_ && args_sent_ < end) delta_of_current(out).arguments += obj_.substr(args_sent_, end - args_sent_);
      args_sent_ = end;
    } else {
      // Arguments given as a string of JSON (some models): its text, once whole.
      const auto j = nlohmann::json::parse(raw, nullptr, false);
      args_text_ = j.is_string() ? j.get<std::string>() : raw;
      args_from_string_ = true;
      args_done_ = true;
      if (name_sent_) delta_of_current(out).arguments += args_text_;
    }
  }
  phase_ = Phase::kAfterValue;
  value_begin_ = kNone;
}

// Scans pending_ into the call's object; true once the object has closed.
bool ToolCallStream::scan_call(ToolStreamDelta& out) {
  std::size_t used = 0;
  bool closed = false;
  for (; used < pending_.size() && !closed; ++used) {
    const char c = pending_[used];
    if (obj_.empty()) {
      if (is_space(c)) {
        marker_ += c;
        continue;
      }
      if (c != '{') {  // not a call after all
        pending_.erase(0, used);
        abandon_call(out);
        return true;
      }
    }
    obj_ += c;
    const std::size_t idx = obj_.size() - 1;
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
        if (depth_ == 1 && phase_ == Phase::kKey) {
          const auto j = nlohmann::json::parse(obj_.substr(key_begin_, idx + 1 - key_begin_), nullptr, false);
          key_ = j.is_string() ? j.get<std::string>() : "";
          phase_ = Phase::kColon;
        } else if (depth_ == 1 && phase_ == Phase::kValue) {
          value_done(out, idx + 1);
        }
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string_ = true;
        if (depth_ == 1 && phase_ == Phase::kKey) key_begin_ = idx;
        if (depth_ == 1 && phase_ == Phase::kValue && value_begin_ == kNone) value_begin_ = idx;
        break;
      case '{':
      case '[':
        if (depth_ == 1 && phase_ == Phase::kValue && value_begin_ == kNone) {
          value_begin_ = idx;
          if (c == '{' && is_arguments_key(key_) && !args_done_) {
            args_streaming_ = true;
            args_begin_ = args_sent_ = idx;
          }
        }
        ++depth_;
        break;
      case '}':
      case ']':
        if (depth_ == 1 && phase_ == Phase::kValue && value_begin_ != kNone) value_done(out, idx);  // a number, true, ...
        --depth_;
        if (depth_ == 1 && phase_ == Phase::kValue && value_begin_ != kNone) value_done(out, idx + 1);
        if (depth_ <= 0) closed = true;
        break;
      case ':':
        if (depth_ == 1 && phase_ == Phase::kColon) phase_ = Phase::kValue;
        break;
      case ',':
        if (depth_ == 1) {
          if (phase_ == Phase::kValue && value_begin_ != kNone) value_done(out, idx);
          phase_ = Phase::kKey;
        }
        break;
      default:
        if (depth_ == 1 && phase_ == Phase::kValue && value_begin_ == kNone && !is_space(c)) value_begin_ = idx;
    }
  }
  pending_.erase(0, used);
  if (name_sent_ && args_streaming_ && args_sent_ < obj_.size()) {
    delta_of_current(out).arguments += obj_.substr(args_sent_);
    args_sent_ = obj_.size();
  }
  if (closed) call_done(out);
  return closed;
}

void ToolCallStream::call_done(ToolStreamDelta& out) {
  if (!name_sent_) return abandon_call(out);  // no name: it was text
  const auto j = nlohmann::json::parse(obj_, nullptr, false);
  bool ok = j.is_object() && j.contains("name") && j["name"].is_string();
  bool has_args = false;
  for (const char* k : {"arguments", "parameters"}) {
    if (!ok || !j.contains(k)) continue;
    has_args = true;
    const auto& a = j[k];
    const auto inner = a.is_string() ? nlohmann::json::parse(a.get<std::string>(), nullptr, false) : a;
    if (!inner.is_object()) ok = false;
  }
  if (!ok) ++malformed_;
  if (!has_args) delta_of_current(out).arguments += "{}";
  open_call_ = false;
  marker_.clear();
  obj_.clear();
  state_ = State::kAfterCall;
}

// What looked like a call is not one: its text is content, and so is what follows.
void ToolCallStream::abandon_call(ToolStreamDelta& out) {
  open_call_ = false;
  if (name_sent_) {
    ++malformed_;
  } else {
    out.content += marker_ + obj_;
  }
  marker_.clear();
  obj_.clear();
  state_ = parser_ == ToolParser::kLlama3Json ? State::kText : State::kContent;
  step(out);
}

ToolStreamDelta ToolCallStream::finish() {
  ToolStreamDelta out;
  switch (state_) {
    case State::kCall:
      if (!name_sent_) {
        out.content += marker_ + obj_ + pending_;
        open_call_ = false;
      } else {
        open_call_ = true;  // cut off: not well formed
      }
      break;
    case State::kAfterCall: {
      // A closing tag or separator that did not come: space and a part of the tag are dropped.
      const std::string_view rest = std::string_view(pending_).substr(skip_space(pending_));
      if (!(parser_ == ToolParser::kHermes && kHermesClose.starts_with(rest))) out.content += rest;
      if (parser_ == ToolParser::kMistral && in_array_) ++malformed_;
      break;
    }
    default:
      out.content += pending_;
  }
  pending_.clear();
  state_ = State::kText;
  return out;
}

ParsedToolOutput parse_tool_calls(ToolParser parser, std::string_view text) {
  ToolCallStream stream(parser);
  ParsedToolOutput out;
  for (auto d : {stream.feed(text), stream.finish()}) {
    out.content += d.content;
    for (auto& c : d.calls) {
      if (c.index >= static_cast<int>(out.calls.size())) out.calls.push_back({.id = c.id, .name = c.name});
      out.calls[static_cast<std::size_t>(c.index)].arguments += c.arguments;
    }
  }
  if (!stream.well_formed()) return {.content = std::string(text), .calls = {}};
  if (!out.calls.empty() && skip_space(out.content) == out.content.size()) out.content.clear();
  return out;
}

Result<std::shared_ptr<const text::Grammar>> tool_call_grammar(ToolParser parser, const nlohmann::ordered_json& tools,
                                                               const std::string& only, bool parallel) {
  using text::GrammarNode;
  using Kind = GrammarNode::Kind;
  auto g = std::make_shared<text::Grammar>();
  auto literal = [&](std::string s) { return g->add(GrammarNode{.kind = Kind::kLiterals, .literals = {std::move(s)}}); };
  // One call's JSON object per function: its name, then its arguments.
  GrammarNode calls{.kind = Kind::kAlt};
  const std::string args_key = parser == ToolParser::kLlama3Json ? "parameters" : "arguments";
  for (const auto& t : tools) {
    const auto& f = t["function"];
    const std::string name = f["name"].get<std::string>();
    if (!only.empty() && name != only) continue;
    const nlohmann::ordered_json params = f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"]
                                                                                                  : nlohmann::ordered_json{{"type", "object"}};
    auto args = text::add_json_schema(*g, params, params);
    if (!args.has_value()) return error(StatusCode::kInvalidArgument, "function " + name + ": " + args.error().message());
    GrammarNode call{.kind = Kind::kObject};
    call.properties.push_back({nlohmann::ordered_json("name").dump(), literal(nlohmann::ordered_json(name).dump()), true});
    call.properties.push_back({nlohmann::ordered_json(args_key).dump(), *args, true});
    calls.children.push_back(g->add(std::move(call)));
  }
  if (calls.children.empty()) return error(StatusCode::kInvalidArgument, "no function to call");
  const std::int32_t call = g->add(std::move(calls));
  const std::uint32_t most = parallel && only.empty() ? UINT32_MAX : 1;
  switch (parser) {
    case ToolParser::kHermes: {
      const std::int32_t one = g->add(GrammarNode{.kind = Kind::kSeq, .children = {literal("<tool_call>\n"), call, literal("\n</tool_call>")}});
      g->root = g->add(GrammarNode{.kind = Kind::kRepeat, .item = one, .separator = literal("\n"), .min = 1, .max = most});
      break;
    }
    case ToolParser::kLlama3Json:
      g->root = call;
      break;
    case ToolParser::kMistral: {
      const std::int32_t list = g->add(GrammarNode{.kind = Kind::kArray, .item = call, .min = 1, .max = most});
      g->root = g->add(GrammarNode{.kind = Kind::kSeq, .children = {literal("[TOOL_CALLS]"), list}});
      break;
    }
  }
  LMSERVE_RETURN_IF_ERROR(g->finish());
  return std::shared_ptr<const text::Grammar>(std::move(g));
}

}  // namespace lmserve::server
