// server/tool_calls: the tool calls in a model's output, in the formats the popular chat templates
// teach, by vLLM's parser names (`--tool-call-parser`):
//
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number, with text
//                around them as content (Hermes, Qwen2.5, Qwen3)
//   llama3_json  {"name": ..., "parameters": {...}} as the whole output, optionally after
//                <|python_tag|>, several separated by ";" (Llama 3.1 / 3.2); an output that does
//                not begin with one is content
//   mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], with content before it
//                (Mistral)
//
// ToolCallStream reads an output as it is generated and gives back content and calls in
// OpenAI's stream shape: a call's index, id and name first, then its arguments in pieces as
// they come (the arguments' JSON text as the model wrote it). Text that may still become a
// marker is held back, so no part of a marker ever reaches content. parse_tool_calls() reads a
// whole output through the same stream, so the two never disagree; a whole output whose calls
// do not parse is all content, as it came.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "text/grammar.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lmserve::server {

enum class ToolParser { kHermes, kLlama3Json, kMistral };
std::optional<ToolParser> tool_parser_named(std::string_view name);  // vLLM's names

// A new call's id: "call_" and 24 letters and digits; Mistral's templates require 9 of them.
std::string make_tool_call_id(ToolParser p);

struct ToolCall {
  std::string id, name;
  std::string arguments;  // JSON text of an object
};

struct ToolCallDelta {
  int index = 0;
  std::string id, name;   // in a call's first delta only
  std::string arguments;  // the next piece of its arguments
};

struct ToolStreamDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

class ToolCallStream {
 public:
  explicit ToolCallStream(ToolParser parser) : parser_(parser) {}
  // The next generated text; what can be told of it now.
  ToolStreamDelta feed(std::string_view text);
  // The end of the output: what was held back. A call cut off before its name was complete goes
  // out as the content it was.
  ToolStreamDelta finish();
  int calls() const { return next_index_; }  // calls begun (their names given)
  // Every call ended well formed (a JSON object with a string name and object arguments).
  bool well_formed() const { return malformed_ == 0 && !open_call_; }

 private:
  enum class State { kStart, kContent, kCall, kAfterCall, kText };
  enum class Phase { kKey, kColon, kValue, kAfterValue };
  void step(ToolStreamDelta& out);
  bool scan_call(ToolStreamDelta& out);  // false: needs more text
  void value_done(ToolStreamDelta& out, std::size_t end);
  void call_done(ToolStreamDelta& out);
  void emit_name(ToolStreamDelta& out);
  void abandon_call(ToolStreamDelta& out);
  void start_call();
  ToolCallDelta& delta_of_current(ToolStreamDelta& out);

  ToolParser parser_;
  State state_ = State::kStart;
  std::string pending_;  // text not yet decided
  // The call being read: its JSON text so far, and where the scan is.
  std::string obj_, marker_;  // marker_: the text that opened it (content again if it is abandoned)
  std::size_t pos_ = 0;
  int depth_ = 0;
  bool in_string_ = false, escape_ = false, open_call_ = false;
  Phase phase_ = Phase::kKey;
  std::size_t key_begin_ = 0, value_begin_ = 0;
  std::string key_;
  bool args_streaming_ = false;  // the arguments value is an object being scanned
  std::size_t args_begin_ = 0, args_sent_ = 0, args_end_ = 0;
  bool args_done_ = false, args_from_string_ = false;
  std::string name_, args_text_;
  bool name_sent_ = false;
  int next_index_ = 0, malformed_ = 0;
  bool in_array_ = false;  // mistral: inside [TOOL_CALLS][...]
};

struct ParsedToolOutput {
  std::string content;
  std::vector<ToolCall> calls;
};
// A whole output: its content and calls (ids made by make_tool_call_id).
ParsedToolOutput parse_tool_calls(ToolParser parser, std::string_view text);

// tool_choice "required" or a named function, held by constrained decoding: the output is one
// or more calls in the parser's format (Hermes: <tool_call>\n{"name": ..., "arguments": ...}\n
// </tool_call>, one per line; Llama 3 JSON: one {"name": ..., "parameters": ...}; Mistral:
// [TOOL_CALLS][{"name": ..., "arguments": ...}, ...]), each naming a function of `tools` (only
// `only` when not empty) with arguments that validate against its `parameters` schema. One
// call at most when `parallel` is false. InvalidArgument for a schema the grammars cannot
// follow (json_schema's message).
Result<std::shared_ptr<const text::Grammar>> tool_call_grammar(ToolParser parser, const nlohmann::ordered_json& tools,
                                                               const std::string& only, bool parallel);

}  // namespace lmserve::server
