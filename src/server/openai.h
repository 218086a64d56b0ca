// The OpenAI protocol: request bodies -> engine requests (with every field's type and range
// checked), engine events -> response bodies and stream chunks in OpenAI's exact shapes.
// Pure functions; no I/O, no engine calls.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/expected.h"
#include "engine/engine.h"
#include "server/errors.h"
#include "server/tool_calls.h"
#include "text/chat_template.h"

namespace lmserve::server {

struct ParsedRequest {
  bool chat = false;
  std::string model;
  engine::SamplingParams params;
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;
  std::string lane;
  std::int32_t priority = 0;
  std::string cache_salt;
  bool logprobs = false;  // chat: logprobs=true; completions: logprobs=N
  // chat
  text::ChatRequest chat_request;
  bool tools_auto = false;  // tools given and tool_choice "auto" (stated or by default): calls are read from the output
  // tool_choice "required" (forced_tool empty) or a named function: the output is held to
  // tool calls by a grammar (made where the server's tool-call format is known), and read.
  bool tools_forced = false;
  std::string forced_tool;
  bool parallel_tool_calls = true;
  // response_format json_object / json_schema, or vLLM's guided_json / guided_regex /
  // guided_choice (or structured_outputs): params.grammar is set.
  bool structured = false;
  // completions
  std::optional<std::string> prompt_text;
  std::vector<std::int32_t> prompt_ids;
};

// Checks `body` (already valid JSON) for /v1/chat/completions (chat) or /v1/completions.
Expected<ParsedRequest, ApiError> parse_request(const nlohmann::ordered_json& body, bool chat);

struct ChoiceResult {
  std::string text;
  std::vector<std::int32_t> token_ids;
  std::vector<engine::SampleResult> logprobs;
  engine::FinishReason finish = engine::FinishReason::kNone;
  std::string stop_reason;
  std::vector<ToolCall> tool_calls;  // read from the output (then `text` is the rest of it)
};

struct Usage {
  std::int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

std::string finish_reason_name(engine::FinishReason r);

class ResponseWriter {
 public:
  ResponseWriter(bool chat, std::string id, std::int64_t created, std::string model, const text::Tokenizer* tokenizer)
      : chat_(chat), id_(std::move(id)), created_(created), model_(std::move(model)), tok_(tokenizer) {}

  const std::string& id() const { return id_; }
  std::string full(const std::vector<ChoiceResult>& choices, const Usage& usage, bool want_logprobs) const;
  // One SSE event ("data: {...}\n\n"). role_chunk: the first chat chunk of a choice.
  std::string role_chunk(std::int32_t index) const;
  // called_tools: the choice made tool calls, so a stop is finish_reason "tool_calls".
  std::string delta_chunk(std::int32_t index, const std::string& text, const std::vector<engine::SampleResult>& logprobs,
                          engine::FinishReason finish, bool want_logprobs, bool called_tools = false) const;
  // Tool calls' deltas of a choice: a call's index, id, type and name first, then its arguments.
  std::string tool_calls_chunk(std::int32_t index, const std::vector<ToolCallDelta>& calls) const;
  std::string usage_chunk(const Usage& usage) const;
  static std::string done() { return "data: [DONE]\n\n"; }
  static std::string error_event(const ApiError& e) { return "data: " + e.body() + "\n\n"; }

 private:
  nlohmann::ordered_json base(const char* object) const;
  nlohmann::ordered_json logprobs_json(const std::vector<engine::SampleResult>& lps) const;
  static nlohmann::ordered_json usage_json(const Usage& u);

  bool chat_;
  std::string id_;
  std::int64_t created_;
  std::string model_;
  const text::Tokenizer* tok_;
};

}  // namespace lmserve::server
