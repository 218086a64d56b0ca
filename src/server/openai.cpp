#include "server/openai.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string_view>

#include "common/build_info.h"
#include "common/json_depth.h"
#include "text/grammar.h"
#include "text/json_schema.h"

namespace lmserve::server {

using ojson = nlohmann::ordered_json;

namespace {

using Err = Unexpected<ApiError>;

Err type_error(const std::string& field, const char* what) {
  return Err(ApiError::bad_request("'" + field + "' must be " + what + ".", "invalid_type", field));
}
Err range_error(const std::string& field, const std::string& what) {
  return Err(ApiError::bad_request("'" + field + "' " + what + ".", "invalid_value", field));
}

// Reads optional typed fields; a present field of the wrong type is an error.
struct Reader {
  const ojson& j;

  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  std::optional<Err> number(const char* k, double* out) const {
    if (!has(k)) return std::nullopt;
    if (!j[k].is_number()) return type_error(k, "a number");
    double v = j[k].get<double>();
    if (!std::isfinite(v)) return range_error(k, "must be finite");
    *out = v;
    return std::nullopt;
  }
  template <typename Int>
  std::optional<Err> integer(const char* k, Int* out, std::int64_t lo, std::int64_t hi) const {
    if (!has(k)) return std::nullopt;
    if (!j[k].is_number_integer()) return type_error(k, "an integer");
    if (j[k].is_number_unsigned() && j[k].get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) {
      return range_error(k, "must be at most " + std::to_string(hi));
    }
    std::int64_t v = j[k].get<std::int64_t>();
    if (v < lo || v > hi) return range_error(k, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    *out = static_cast<Int>(v);
    return std::nullopt;
  }
  std::optional<Err> boolean(const char* k, bool* out) const {
    if (!has(k)) return std::nullopt;
    if (!j[k].is_boolean()) return type_error(k, "a boolean");
    *out = j[k].get<bool>();
    return std::nullopt;
  }
  std::optional<Err> string(const char* k, std::string* out, std::size_t max_len = 1 << 16) const {
    if (!has(k)) return std::nullopt;
    if (!j[k].is_string()) return type_error(k, "a string");
    *out = j[k].get<std::string>();
    if (out->size() > max_len) return range_error(k, "is too long");
    return std::nullopt;
  }
};

#define LMSERVE_CHECK(expr)                        \
  do {                                             \
    if (auto lmserve_err_ = (expr)) return *lmserve_err_; \
  } while (false)

// The grammar of a structured output: `kind` json (a JSON Schema, or a string of one), regex
// (a string) or choice (a list of strings). A schema or pattern the grammars cannot follow is
// a 400 naming what.
std::optional<Err> structured_grammar(const ojson& v, const std::string& kind, const std::string& param, ParsedRequest& p) {
  Result<std::shared_ptr<const text::Grammar>> g = error(StatusCode::kInvalidArgument, "");
  if (kind == "json") {
    ojson schema = v;
    if (v.is_string()) {
      if (json_deeper_than(v.get<std::string>())) return type_error(param, "a JSON Schema (an object, or a string of one)");
      schema = ojson::parse(v.get<std::string>(), nullptr, false);
      if (schema.is_discarded()) return type_error(param, "a JSON Schema (an object, or a string of one)");
    }
    if (!schema.is_object() && !schema.is_boolean()) return type_error(param, "a JSON Schema (an object, or a string of one)");
    g = text::compile_json_schema(schema);
  } else if (kind == "regex") {
    if (!v.is_string()) return type_error(param, "a string");
    g = text::Grammar::regex(v.get<std::string>());
  } else {
    if (!v.is_array() || v.empty() || !std::all_of(v.begin(), v.end(), [](const ojson& x) { return x.is_string(); })) {
      return type_error(param, "a non-empty list of strings");
    }
    g = text::Grammar::choice(v.get<std::vector<std::string>>());
  }
  if (!g.has_value()) return Err(ApiError::bad_request("Invalid " + param + ": " + g.error().message() + ".", "invalid_value", param));
  p.params.grammar = std::move(*g);
  return std::nullopt;
}

std::optional<Err> parse_common(const Reader& r, ParsedRequest& p) {
  auto& s = p.params;
  LMSERVE_CHECK(r.string("model", &p.model, 512));
  LMSERVE_CHECK(r.number("temperature", &s.temperature));
  if (s.temperature < 0 || s.temperature > 100) return range_error("temperature", "must be between 0 and 100");
  LMSERVE_CHECK(r.number("top_p", &s.top_p));
  LMSERVE_CHECK(r.integer("top_k", &s.top_k, -1, 1 << 30));
  LMSERVE_CHECK(r.number("min_p", &s.min_p));
  LMSERVE_CHECK(r.number("presence_penalty", &s.presence_penalty));
  LMSERVE_CHECK(r.number("frequency_penalty", &s.frequency_penalty));
  LMSERVE_CHECK(r.number("repetition_penalty", &s.repetition_penalty));
  LMSERVE_CHECK(r.integer("n", &s.n, 1, 128));
  std::int64_t seed = 0;
  if (r.has("seed")) {
    LMSERVE_CHECK(r.integer("seed", &seed, std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()));
    s.seed = static_cast<std::uint64_t>(seed);
  }
  LMSERVE_CHECK(r.boolean("stream", &p.stream));
  LMSERVE_CHECK(r.boolean("ignore_eos", &s.ignore_eos));
  LMSERVE_CHECK(r.integer("min_tokens", &s.min_tokens, 0, 1 << 30));
  LMSERVE_CHECK(r.boolean("skip_special_tokens", &s.skip_special_tokens));
  LMSERVE_CHECK(r.boolean("include_stop_str_in_output", &s.include_stop_str_in_output));
  LMSERVE_CHECK(r.integer("priority", &p.priority, -1000000, 1000000));
  LMSERVE_CHECK(r.string("cache_salt", &p.cache_salt, 1024));
  LMSERVE_CHECK(r.string("lane", &p.lane, 64));
  // OpenAI's end-user id: a string (the gateway's affinity and canary stickiness read it too).
  std::string user;
  LMSERVE_CHECK(r.string("user", &user));
  if (r.has("stop")) {
    const ojson& st = r.j["stop"];
    if (st.is_string()) {
      s.stop = {st.get<std::string>()};
    } else if (st.is_array()) {
      for (const auto& x : st) {
        if (!x.is_string()) return type_error("stop", "a string or a list of strings");
        s.stop.push_back(x.get<std::string>());
      }
    } else {
      return type_error("stop", "a string or a list of strings");
    }
  }
  if (r.has("stop_token_ids")) {
    if (!r.j["stop_token_ids"].is_array()) return type_error("stop_token_ids", "a list of integers");
    for (const auto& x : r.j["stop_token_ids"]) {
      if (!x.is_number_integer()) return type_error("stop_token_ids", "a list of integers");
      std::int64_t v = x.get<std::int64_t>();
      if (v < 0 || v > (1 << 30)) return range_error("stop_token_ids", "holds an id outside the vocabulary");
      s.stop_token_ids.push_back(static_cast<std::int32_t>(v));
    }
  }
  if (r.has("logit_bias")) {
    if (!r.j["logit_bias"].is_object()) return type_error("logit_bias", "an object mapping token ids to numbers");
    for (const auto& [k, v] : r.j["logit_bias"].items()) {
      char* end = nullptr;
      long id = std::strtol(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || id < 0 || id > (1 << 30)) return range_error("logit_bias", "keys must be token ids");
      if (!v.is_number()) return type_error("logit_bias", "an object mapping token ids to numbers");
      s.logit_bias.emplace_back(static_cast<std::int32_t>(id), v.get<float>());
    }
  }
  if (r.has("stream_options")) {
    const ojson& so = r.j["stream_options"];
    if (!so.is_object()) return type_error("stream_options", "an object");
    if (so.contains("include_usage") && !so["include_usage"].is_null()) {
      if (!so["include_usage"].is_boolean()) return type_error("stream_options.include_usage", "a boolean");
      p.include_usage = so["include_usage"].get<bool>();
    }
  }
  return std::nullopt;
}

}  // namespace

Expected<ParsedRequest, ApiError> parse_request(const ojson& body, bool chat) {
  if (!body.is_object()) return Err(ApiError::bad_request("The request body must be a JSON object.", "invalid_body"));
  ParsedRequest p;
  p.chat = chat;
  Reader r{body};
  if (auto e = parse_common(r, p)) return *e;
  auto& s = p.params;
  s.max_tokens = 0;
  for (const char* k : {"max_tokens", "max_completion_tokens"}) {
    if (r.has(k)) {
      if (auto e = r.integer(k, &s.max_tokens, 1, 1 << 30)) return *e;
      p.max_tokens_given = true;
    }
  }
  if (chat) {
    if (!body.contains("messages") || !body["messages"].is_array()) return type_error("messages", "a list of messages");
    if (body["messages"].empty()) return range_error("messages", "must not be empty");
    ojson messages = ojson::array();
    for (const auto& m : body["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        return type_error("messages", "a list of objects with a string 'role'");
      }
      // Only the roles the chat templates know: an invented one ("system2", "admin") would reach
      // the template as text a client chose, a way to dress a user's words as instructions.
      static constexpr std::string_view kRoles[] = {"system", "developer", "user", "assistant", "tool"};
      const std::string& role = m["role"].get_ref<const std::string&>();
      if (std::find(std::begin(kRoles), std::end(kRoles), role) == std::end(kRoles)) {
        return Err(ApiError::bad_request("A message's 'role' must be one of system, developer, user, assistant or tool.", "invalid_value",
                                         "messages"));
      }
      ojson msg = m;
      if (role == "assistant" && m.contains("tool_calls")) {
        // The templates write a call's arguments as an object (tojson): OpenAI's clients send them
        // as a string of JSON.
        if (!m["tool_calls"].is_array()) return type_error("messages.tool_calls", "a list");
        for (auto& call : msg["tool_calls"]) {
          if (!call.is_object() || !call.contains("function") || !call["function"].is_object() || !call["function"].contains("name") ||
              !call["function"]["name"].is_string()) {
            return type_error("messages.tool_calls", "a list of {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
          }
          auto& args = call["function"]["arguments"];
          if (args.is_string()) {
            auto parsed = json_deeper_than(args.get<std::string>()) ? ojson() : ojson::parse(args.get<std::string>(), nullptr, false);
            if (!parsed.is_object()) return type_error("messages.tool_calls.function.arguments", "a JSON object (as a string)");
            args = std::move(parsed);
          } else if (!args.is_object()) {
            return type_error("messages.tool_calls.function.arguments", "a JSON object (as a string)");
          }
        }
      }
      if (role == "tool" && m.contains("tool_call_id") && !m["tool_call_id"].is_string()) return type_error("messages.tool_call_id", "a string");
      if (m.contains("content") && m["content"].is_array()) {
        std::string text;  // text parts are joined; other part types are not supported
        for (const auto& part : m["content"]) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
            return Err(ApiError::bad_request("Only text content parts are supported.", "not_supported", "messages"));
          }
          text += part["text"].get<std::string>();
        }
        msg["content"] = text;
      } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
        return type_error("messages.content", "a string or a list of text parts");
      }
      messages.push_back(std::move(msg));
    }
    p.chat_request.messages = std::move(messages);
    if (r.has("tools")) {
      if (!body["tools"].is_array()) return type_error("tools", "a list");
      for (const auto& t : body["tools"]) {
        if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object() ||
            !t["function"].contains("name") || !t["function"]["name"].is_string()) {
          return type_error("tools", "a list of {\"type\": \"function\", \"function\": {\"name\", ...}}");
        }
      }
      if (!body["tools"].empty()) p.chat_request.tools = body["tools"];
    }
    p.tools_auto = !p.chat_request.tools.is_null();
    if (auto e = r.boolean("parallel_tool_calls", &p.parallel_tool_calls)) return *e;
    if (r.has("tool_choice")) {
      const ojson& tc = body["tool_choice"];
      if (tc.is_string() && (tc == "none" || tc == "auto" || tc == "required")) {
        if (tc == "none") p.tools_auto = false;  // the template still sees the tools (as vLLM's does); no calls are read
        if (tc == "required") p.tools_forced = true;
      } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("function") && tc["function"].is_object() &&
                 tc["function"].contains("name") && tc["function"]["name"].is_string()) {
        p.tools_forced = true;
        p.forced_tool = tc["function"]["name"].get<std::string>();
      } else {
        return Err(ApiError::bad_request("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}.",
                                         "invalid_value", "tool_choice"));
      }
      if (p.tools_forced) {
        if (p.chat_request.tools.is_null()) {
          return Err(ApiError::bad_request("tool_choice 'required' or a named function needs 'tools'.", "invalid_value", "tool_choice"));
        }
        if (!p.forced_tool.empty()) {
          const bool known = std::any_of(p.chat_request.tools.begin(), p.chat_request.tools.end(),
                                         [&](const ojson& t) { return t["function"]["name"] == p.forced_tool; });
          if (!known) return Err(ApiError::bad_request("tool_choice names a function that is not in 'tools'.", "invalid_value", "tool_choice"));
        }
        p.tools_auto = false;
      }
    }
    if (r.has("response_format")) {
      const ojson& rf = body["response_format"];
      std::string type;
      if (rf.is_object() && rf.contains("type")) {
        if (!rf["type"].is_string()) return type_error("response_format.type", "a string");
        type = rf["type"].get<std::string>();
      }
      if (type == "json_object") {
        p.params.grammar = text::Grammar::json_object();
      } else if (type == "json_schema") {
        if (!rf.contains("json_schema") || !rf["json_schema"].is_object() || !rf["json_schema"].contains("schema")) {
          return type_error("response_format.json_schema", "an object with a 'schema'");
        }
        if (auto e = structured_grammar(rf["json_schema"]["schema"], "json", "response_format", p)) return *e;
      } else if (type != "text") {
        return Err(ApiError::bad_request("response_format type must be 'text', 'json_object' or 'json_schema'.", "invalid_value",
                                         "response_format"));
      }
      p.structured = p.params.grammar != nullptr;
    }
    bool lp = false;
    if (auto e = r.boolean("logprobs", &lp)) return *e;
    std::int32_t top = 0;
    if (auto e = r.integer("top_logprobs", &top, 0, 20)) return *e;
    if (lp) s.logprobs = top;
    p.logprobs = lp;
    bool agp = true;
    if (auto e = r.boolean("add_generation_prompt", &agp)) return *e;
    p.chat_request.add_generation_prompt = agp;
    if (r.has("continue_final_message") && body["continue_final_message"] == true) {
      return Err(ApiError::bad_request("continue_final_message is not supported.", "not_supported", "continue_final_message"));
    }
    if (r.has("chat_template_kwargs")) {
      if (!body["chat_template_kwargs"].is_object()) return type_error("chat_template_kwargs", "an object");
      p.chat_request.variables = body["chat_template_kwargs"];
    }
  } else {
    if (!body.contains("prompt")) return type_error("prompt", "a string or a list of token ids");
    const ojson& pr = body["prompt"];
    if (pr.is_string()) {
      if (pr.get_ref<const std::string&>().empty()) return range_error("prompt", "must not be empty");
      p.prompt_text = pr.get<std::string>();
    } else if (pr.is_array() && !pr.empty() && pr[0].is_number_integer()) {
      for (const auto& t : pr) {
        if (!t.is_number_integer()) return type_error("prompt", "a string or a list of token ids");
        std::int64_t v = t.get<std::int64_t>();
        if (v < 0 || v > (1 << 30)) return range_error("prompt", "holds a token id outside the vocabulary");
        p.prompt_ids.push_back(static_cast<std::int32_t>(v));
      }
    } else if (pr.is_array() && pr.size() == 1 && pr[0].is_string()) {
      p.prompt_text = pr[0].get<std::string>();
      if (p.prompt_text->empty()) return range_error("prompt", "must not be empty");
    } else if (pr.is_array() && pr.empty()) {
      return range_error("prompt", "must not be empty");
    } else {
      return Err(ApiError::bad_request("Only one prompt per request is supported: a string or a list of token ids.",
                                       "not_supported", "prompt"));
    }
    if (r.has("logprobs")) {
      std::int32_t n = 0;
      if (auto e = r.integer("logprobs", &n, 0, 20)) return *e;
      s.logprobs = n;
      p.logprobs = true;
    }
    if (r.has("echo") && body["echo"] == true) return Err(ApiError::bad_request("echo is not supported.", "not_supported", "echo"));
    if (r.has("suffix")) return Err(ApiError::bad_request("suffix is not supported.", "not_supported", "suffix"));
    if (r.has("best_of")) {
      std::int32_t b = 1;
      if (auto e = r.integer("best_of", &b, 1, 1)) return *e;
    }
  }
  // vLLM's extras: guided_json / guided_regex / guided_choice, or structured_outputs {json, regex, choice}.
  ojson guided = ojson::object();
  for (const char* k : {"json", "regex", "choice", "grammar"}) {
    if (const std::string name = std::string("guided_") + k; r.has(name.c_str())) guided[k] = body[name];
  }
  if (r.has("structured_outputs")) {
    if (!body["structured_outputs"].is_object()) return type_error("structured_outputs", "an object");
    for (const auto& [k, v] : body["structured_outputs"].items()) {
      if (k == "json" || k == "regex" || k == "choice" || k == "grammar") guided[k] = v;
    }
  }
  if (!guided.empty()) {
    if (guided.size() > 1 || p.params.grammar) {
      return Err(ApiError::bad_request("Only one of response_format (json), guided_json, guided_regex and guided_choice may be given.",
                                       "invalid_value", "guided_json"));
    }
    const auto first = guided.begin();
    const std::string kind = first.key();
    const ojson& v = first.value();
    if (kind == "grammar") {
      return Err(ApiError::bad_request("guided_grammar is not supported; use guided_json, guided_regex or guided_choice.", "not_supported",
                                       "guided_grammar"));
    }
    if (auto e = structured_grammar(v, kind, "guided_" + kind, p)) return *e;
    p.structured = true;
  }
  if (p.structured && p.tools_forced) {
    return Err(ApiError::bad_request("response_format or guided decoding cannot be combined with tool_choice 'required' or a named function.",
                                     "invalid_value", "tool_choice"));
  }
  return p;
}

std::string finish_reason_name(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kStop: return "stop";
    case engine::FinishReason::kLength: return "length";
    case engine::FinishReason::kAbort: return "abort";
    case engine::FinishReason::kError: return "error";
    default: return "";
  }
}

ojson ResponseWriter::base(const char* object) const {
  return ojson{{"id", id_}, {"object", object}, {"created", created_}, {"model", model_},
               {"system_fingerprint", "lmserve-" + std::string(build_info().version)}};
}

ojson ResponseWriter::usage_json(const Usage& u) {
  ojson j{{"prompt_tokens", u.prompt_tokens}, {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  if (u.cached_tokens > 0) j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
  return j;
}

ojson ResponseWriter::logprobs_json(const std::vector<engine::SampleResult>& lps) const {
  auto token_text = [&](std::int32_t id) { return tok_ ? tok_->decode(std::vector<std::int32_t>{id}, false) : std::to_string(id); };
  auto bytes = [](const std::string& s) {
    ojson b = ojson::array();
    for (unsigned char c : s) b.push_back(c);
    return b;
  };
  if (chat_) {
    ojson content = ojson::array();
    for (const auto& r : lps) {
      std::string t = token_text(r.token);
      ojson top = ojson::array();
      for (const auto& x : r.top) {
        std::string tt = token_text(x.token);
        top.push_back({{"token", tt}, {"logprob", x.logprob}, {"bytes", bytes(tt)}});
      }
      content.push_back({{"token", t}, {"logprob", r.logprob}, {"bytes", bytes(t)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  ojson tokens = ojson::array(), token_lps = ojson::array(), tops = ojson::array();
  for (const auto& r : lps) {
    tokens.push_back(token_text(r.token));
    token_lps.push_back(r.logprob);
    ojson top = ojson::object();
    for (const auto& x : r.top) top[token_text(x.token)] = x.logprob;
    tops.push_back(top);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}};
}

std::string ResponseWriter::full(const std::vector<ChoiceResult>& choices, const Usage& usage, bool want_logprobs) const {
  ojson j = base(chat_ ? "chat.completion" : "text_completion");
  ojson cs = ojson::array();
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const auto& c = choices[i];
    ojson choice{{"index", i}};
    if (chat_ && !c.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const auto& t : c.tool_calls) calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
      choice["message"] = {{"role", "assistant"}, {"content", c.text.empty() ? ojson() : ojson(c.text)}, {"tool_calls", std::move(calls)}};
    } else if (chat_) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = want_logprobs ? logprobs_json(c.logprobs) : ojson();
    choice["finish_reason"] = !c.tool_calls.empty() && c.finish == engine::FinishReason::kStop ? "tool_calls" : finish_reason_name(c.finish);
    if (!c.stop_reason.empty()) choice["stop_reason"] = c.stop_reason;
    cs.push_back(std::move(choice));
  }
  j["choices"] = std::move(cs);
  j["usage"] = usage_json(usage);
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string ResponseWriter::role_chunk(std::int32_t index) const {
  ojson j = base("chat.completion.chunk");
  j["choices"] = ojson::array({{{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                                {"finish_reason", nullptr}}});
  return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

std::string ResponseWriter::tool_calls_chunk(std::int32_t index, const std::vector<ToolCallDelta>& calls) const {
  ojson list = ojson::array();
  for (const auto& c : calls) {
    ojson d{{"index", c.index}};
    if (!c.name.empty()) {
      d["id"] = c.id;
      d["type"] = "function";
      d["function"] = {{"name", c.name}, {"arguments", c.arguments}};
    } else {
      d["function"] = {{"arguments", c.arguments}};
    }
    list.push_back(std::move(d));
  }
  ojson j = base("chat.completion.chunk");
  j["choices"] = ojson::array({{{"index", index}, {"delta", {{"tool_calls", std::move(list)}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
  return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

std::string ResponseWriter::delta_chunk(std::int32_t index, const std::string& text, const std::vector<engine::SampleResult>& lps,
                                        engine::FinishReason finish, bool want_logprobs, bool called_tools) const {
  ojson j = base(chat_ ? "chat.completion.chunk" : "text_completion");
  ojson choice{{"index", index}};
  if (chat_) {
    choice["delta"] = text.empty() && finish != engine::FinishReason::kNone ? ojson::object() : ojson{{"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = want_logprobs && !lps.empty() ? logprobs_json(lps) : ojson();
  choice["finish_reason"] = finish == engine::FinishReason::kNone                      ? ojson()
                           : called_tools && finish == engine::FinishReason::kStop ? ojson("tool_calls")
                                                                                   : ojson(finish_reason_name(finish));
  j["choices"] = ojson::array({choice});
  return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

std::string ResponseWriter::usage_chunk(const Usage& usage) const {
  ojson j = base(chat_ ? "chat.completion.chunk" : "text_completion");
  j["choices"] = ojson::array();
  j["usage"] = usage_json(usage);
  return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

}  // namespace lmserve::server
