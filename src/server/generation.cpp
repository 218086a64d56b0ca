// /v1/chat/completions and /v1/completions: a request becomes an engine submit; its stream's
// events become the response, whole or streamed (SSE), on the connection's strand.
#include <spdlog/spdlog.h>

#include <ctime>
#include <deque>
#include <map>

#include "server/openai.h"
#include "server/openai_app.h"

namespace lmserve::server {

namespace {

using engine::Clock;

// One generation request from submit to its answer. Hung on the exchange (set_context), so it
// lives until the answer is out; a generation dropped before its request finished (the
// connection closed) aborts it in the engine.
class Generation {
 public:
  Generation(OpenAiApp& app, http::Exchange ex, std::string route, std::string lane, engine::Submitted sub, ParsedRequest parsed)
      : app_(app), ex_(std::move(ex)), route_(std::move(route)), lane_(std::move(lane)), id_(sub.id), stream_(std::move(sub.stream)),
        parsed_(std::move(parsed)) {
    const bool chat = parsed_.chat;
    writer_.emplace(chat, app_.new_id(chat ? "chatcmpl" : "cmpl"), static_cast<std::int64_t>(std::time(nullptr)),
                    app_.options().served_model_name, &app_.tokenizer());
    choices_.resize(static_cast<std::size_t>(parsed_.params.n));
    if (parsed_.tools_auto) {
      for (std::size_t i = 0; i < choices_.size(); ++i) tool_streams_.emplace_back(*app_.options().tool_call_parser);
    }
    last_token_.assign(choices_.size(), Clock::time_point{});
    started_ = Clock::now();
    app_.count_generation();
  }
  ~Generation() {
    uncount();
    if (!done_) app_.engine().abort(id_);
  }

  // Wires the engine's stream to the strand and starts the answer.
  static void start(const std::shared_ptr<Generation>& g) {
    std::weak_ptr<Generation> weak = g;
    g->stream_->set_notify([ex = g->ex_, weak] {  // on the engine thread: only post
      ex.post([weak] {
        if (auto self = weak.lock()) self->pump();
      });
    });
    g->ex_.watch_disconnect([weak] {
      if (auto self = weak.lock()) self->on_client_gone();
    });
    if (g->parsed_.stream) {
      g->ex_.start_stream({.status = 200,
                           .content_type = "text/event-stream; charset=utf-8",
                           .headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}}});
    }
    g->pump();
  }

 private:
  void on_client_gone() {
    if (done_) return;
    client_gone_ = true;
    app_.engine().abort(id_);  // its final event completes this generation
  }

  void pump() {
    if (done_) return;
    engine::StreamEvent e;
    bool timed_out = false;
    while (stream_->next(&e, std::chrono::milliseconds(0), &timed_out)) on_event(std::move(e));
    if (!timed_out) complete();  // all choices finished
  }

  void on_event(engine::StreamEvent e) {
    auto& c = choices_[static_cast<std::size_t>(e.index)];
    const auto now = Clock::now();
    if (!e.token_ids.empty()) {
      auto& last = last_token_[static_cast<std::size_t>(e.index)];
      if (last == Clock::time_point{}) {
        if (first_token_ == Clock::time_point{}) first_token_ = now;
      } else {
        itl_.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
    }
    c.token_ids.insert(c.token_ids.end(), e.token_ids.begin(), e.token_ids.end());
    c.logprobs.insert(c.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
    c.text += e.text;
    if (e.finish != engine::FinishReason::kNone) {
      c.finish = e.finish;
      c.stop_reason = e.stop_reason;
      usage_.prompt_tokens = e.prompt_tokens;
      usage_.completion_tokens += e.completion_tokens;
      usage_.cached_tokens = e.cached_prompt_tokens;
      if (e.finish == engine::FinishReason::kError) error_ = e.error;
    }
    if (!parsed_.stream || client_gone_) return;
    if (parsed_.chat && !role_sent_[e.index]) {
      ex_.send(writer_->role_chunk(e.index));
      role_sent_[e.index] = true;
    }
    if (e.finish == engine::FinishReason::kError) {
      ex_.send(ResponseWriter::error_event(ApiError::internal("The engine failed while generating.")));
    } else if (!tool_streams_.empty()) {
      send_with_tools(e);
    } else if (!e.text.empty() || !e.token_ids.empty() || e.finish != engine::FinishReason::kNone) {
      ex_.send(writer_->delta_chunk(e.index, e.text, e.logprobs, e.finish, parsed_.logprobs));
    }
  }

  // A streamed choice whose output may hold tool calls: content as the parser lets it go (no
  // marker text), the calls' deltas, and at the end what it held back.
  void send_with_tools(const engine::StreamEvent& e) {
    auto& ts = tool_streams_[static_cast<std::size_t>(e.index)];
    auto d = ts.feed(e.text);
    if (e.finish != engine::FinishReason::kNone) {
      auto rest = ts.finish();
      d.content += rest.content;
      d.calls.insert(d.calls.end(), rest.calls.begin(), rest.calls.end());
    }
    if (!d.calls.empty() && !d.content.empty()) {  // content before the calls, in order
      ex_.send(writer_->delta_chunk(e.index, d.content, e.logprobs, engine::FinishReason::kNone, parsed_.logprobs));
      d.content.clear();
    }
    if (!d.calls.empty()) ex_.send(writer_->tool_calls_chunk(e.index, d.calls));
    if (!d.content.empty() || e.finish != engine::FinishReason::kNone || (parsed_.logprobs && !e.logprobs.empty() && d.calls.empty())) {
      ex_.send(writer_->delta_chunk(e.index, d.content, e.logprobs, e.finish, parsed_.logprobs, ts.calls() > 0));
    }
  }

  void complete() {
    done_ = true;
    stream_->set_notify(nullptr);
    record();
    // A generation stops counting as in flight once its last bytes are queued: a client may
    // start its next request as soon as it reads them, before our write completes.
    uncount();
    if (parsed_.stream) {
      if (!client_gone_) {
        if (parsed_.include_usage) ex_.send(writer_->usage_chunk(usage_));
        ex_.send(ResponseWriter::done());
      }
      return ex_.end_stream();
    }
    if (client_gone_) return ex_.reply({});  // nobody to answer: the transport closes the connection
    if (!error_.empty()) return app_.reply_error(ex_, ApiError::internal("The engine failed while generating."), route_);
    if (!tool_streams_.empty()) {
      for (auto& c : choices_) {
        auto parsed = parse_tool_calls(*app_.options().tool_call_parser, c.text);
        if (parsed.calls.empty()) continue;
        c.text = std::move(parsed.content);
        c.tool_calls = std::move(parsed.calls);
      }
    }
    app_.reply(ex_, 200, writer_->full(choices_, usage_, parsed_.logprobs), route_);
  }

  void record() {
    RequestRecord r;
    auto times = stream_->times();
    const auto end = Clock::now();
    auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
    r.queue_s = times.first_scheduled != Clock::time_point{} ? secs(times.first_scheduled - times.arrival) : secs(end - started_);
    r.ttft_s = first_token_ != Clock::time_point{} ? secs(first_token_ - started_) : 0;
    r.e2e_s = secs(end - started_);
    r.itl_s = itl_;
    r.prompt_tokens = usage_.prompt_tokens;
    r.generation_tokens = usage_.completion_tokens;
    engine::FinishReason worst = engine::FinishReason::kStop;
    for (const auto& c : choices_) {
      if (c.finish == engine::FinishReason::kAbort || c.finish == engine::FinishReason::kError) worst = c.finish;
      if (worst == engine::FinishReason::kStop && c.finish == engine::FinishReason::kLength) worst = c.finish;
    }
    r.finish_reason = finish_reason_name(worst);
    r.lane = lane_;
    app_.metrics().record_request(r);
    // A whole answer is counted when it is sent; a stream's status went out with its head.
    if (parsed_.stream || client_gone_) app_.metrics().record_http(route_, client_gone_ ? 499 : 200);
    ojson line{{"event", "request"}, {"id", writer_->id()},
               {"lane", lane_}, {"priority", parsed_.priority},
               {"status", client_gone_ ? "client_gone" : "ok"}, {"prompt_tokens", r.prompt_tokens},
               {"completion_tokens", r.generation_tokens}, {"queue_s", r.queue_s}, {"ttft_s", r.ttft_s}, {"total_s", r.e2e_s},
               {"finish_reason", r.finish_reason}};
    if (app_.options().log_prompts) {  // off by default: prompts can hold customer data
      if (parsed_.chat) {
        line["messages"] = parsed_.chat_request.messages;
      } else if (parsed_.prompt_text) {
        line["prompt"] = *parsed_.prompt_text;
      }
    }
    spdlog::info("{}", line.dump(-1, ' ', false, ojson::error_handler_t::replace));
  }

  void uncount() {
    if (counted_) app_.uncount_generation();
    counted_ = false;
  }

  OpenAiApp& app_;
  http::Exchange ex_;
  std::string route_;
  std::string lane_;  // the lane's name (a request that names none runs on the last lane)
  engine::RequestId id_;
  std::shared_ptr<engine::RequestStream> stream_;
  ParsedRequest parsed_;
  std::optional<ResponseWriter> writer_;
  std::vector<ChoiceResult> choices_;
  std::map<std::int32_t, bool> role_sent_;
  std::vector<ToolCallStream> tool_streams_;  // a choice's each, when its calls are read
  Usage usage_;
  std::string error_;
  Clock::time_point started_, first_token_;
  std::vector<Clock::time_point> last_token_;
  std::vector<double> itl_;
  bool done_ = false, client_gone_ = false, counted_ = true;
};

}  // namespace

void OpenAiApp::generate(http::Exchange& ex, const ojson& body, bool chat, const std::string& route) {
  if (draining()) return reply_error(ex, ApiError::unavailable("The server is shutting down."), route);
  auto parsed = parse_request(body, chat);
  if (!parsed) return reply_error(ex, parsed.error(), route);
  ParsedRequest& p = *parsed;
  if (p.tools_auto && !(opt_.enable_auto_tool_choice && opt_.tool_call_parser)) {
    return reply_error(ex,
                       ApiError::bad_request("tool_choice 'auto' needs the server started with --enable-auto-tool-choice and --tool-call-parser.",
                                             "not_supported", "tool_choice"),
                       route);
  }
  if (p.tools_forced) {
    // Calls are not hoped for but written: the grammar of the server's tool-call format.
    if (!opt_.tool_call_parser) {
      return reply_error(ex,
                         ApiError::bad_request("tool_choice 'required' or a named function needs the server started with --tool-call-parser.",
                                               "not_supported", "tool_choice"),
                         route);
    }
    auto g = tool_call_grammar(*opt_.tool_call_parser, p.chat_request.tools, p.forced_tool, p.parallel_tool_calls);
    if (!g) return reply_error(ex, ApiError::bad_request("Invalid tools: " + g.error().message() + ".", "invalid_value", "tools"), route);
    p.params.grammar = std::move(*g);
    p.tools_auto = true;  // and the calls are read from the output as with "auto"
  }
  std::vector<std::int32_t> prompt;
  if (chat) {
    auto ids = render_chat(p);
    if (!ids) return reply_error(ex, ids.error(), route);
    prompt = std::move(*ids);
  } else if (p.prompt_text) {
    prompt = tokenizer_->encode(*p.prompt_text);
  } else {
    prompt = p.prompt_ids;
    for (auto t : prompt) {
      if (t >= engine_->model_config().vocab_size) {
        return reply_error(ex, ApiError::bad_request("'prompt' holds a token id outside the vocabulary.", "invalid_value", "prompt"), route);
      }
    }
  }
  if (prompt.empty()) return reply_error(ex, ApiError::bad_request("The prompt is empty after tokenization.", "invalid_value", "prompt"), route);
  // Without max_tokens a request may fill the context; whether it fits is the engine's check
  // (a prompt of the whole context asks for one token, which it refuses).
  if (!p.max_tokens_given) {
    p.params.max_tokens = std::max<std::int64_t>(1, engine_->options().scheduler.max_model_len - static_cast<std::int64_t>(prompt.size()));
  }
  std::string lane(ex.request().header("x-lmserve-lane"));
  if (lane.empty()) lane = p.lane;
  const std::string lane_name = lane.empty() ? engine_->options().scheduler.lanes.back().name : lane;
  auto sub = engine_->submit({.prompt = prompt, .params = p.params, .lane = lane, .priority = p.priority, .cache_salt = p.cache_salt});
  if (!sub) {
    const auto& e = sub.error();
    if (e.rejection != engine::Rejection::kNone) metrics_.record_rejection(std::string(engine::rejection_name(e.rejection)), lane_name);
    return reply_error(ex, ApiError::from_submit(e), route);
  }
  auto g = std::make_shared<Generation>(*this, ex, route, lane_name, std::move(*sub), std::move(p));
  ex.set_context(g);
  Generation::start(g);
}

}  // namespace lmserve::server
