#include "server/server.h"

#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <random>
#include <thread>

#include "common/build_info.h"
#include "server/openai.h"

namespace lmserve::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using ojson = nlohmann::ordered_json;
using engine::Clock;

struct Server::Impl {
  ServerOptions opt;
  std::unique_ptr<engine::Engine> engine;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::optional<text::ChatTemplate> chat_template;
  ServerMetrics metrics;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  std::thread shutdown_thread;
  std::optional<net::ssl::context> ssl;
  // Keeps run() serving until shutdown ends, even with no connection open.
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::atomic<std::size_t> connections{0};
  // Generation requests being served now, and the most at once since start (for load tests:
  // a client's --max-concurrency shows here).
  std::atomic<int> generations{0}, generations_peak{0};
  std::atomic<bool> draining{false};
  std::atomic<int> bound_port{0};
  std::atomic<int> signals{0};
  std::mt19937_64 id_rng{std::random_device{}()};
  std::mutex id_mu;

  std::string new_id(const char* prefix) {
    std::lock_guard lock(id_mu);
    char buf[40];
    std::snprintf(buf, sizeof buf, "%s-%016llx%08llx", prefix, static_cast<unsigned long long>(id_rng()),
                  static_cast<unsigned long long>(id_rng() & 0xffffffffu));
    return buf;
  }

  void accept();
  void begin_shutdown();
};

namespace {

std::string route_of(const std::string& target) { return target.substr(0, target.find('?')); }

bool key_matches(const std::string& header, const std::string& key) {
  const std::string prefix = "Bearer ";
  if (header.size() != prefix.size() + key.size() || header.compare(0, prefix.size(), prefix) != 0) return false;
  unsigned diff = 0;  // constant time over the key
  for (std::size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned>(header[prefix.size() + i] ^ key[i]);
  return diff == 0;
}

// One connection. `Stream` is a plain TCP stream or a TLS stream over one.
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  template <class... Args>
  Session(Server::Impl& s, Args&&... args) : stream_(std::forward<Args>(args)...), timer_(stream_.get_executor()), s_(s) {}
  ~Session() {
    --s_.connections;
    uncount_generation();
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        beast::get_lowest_layer(self->stream_).expires_after(self->s_.opt.request_timeout);
        self->stream_.async_handshake(net::ssl::stream_base::server, [self](beast::error_code ec) {
          if (ec) return self->close();
          self->read();
        });
      } else {
        self->read();
      }
    });
  }

 private:
  // ---- reading requests ----------------------------------------------------------------
  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(s_.opt.max_header_bytes));
    parser_->body_limit(s_.opt.max_body_bytes);
    // Our own timer rather than the stream's expiry: on timeout the stream would close the
    // socket, and a slow client should still get its 408.
    beast::get_lowest_layer(stream_).expires_never();
    timed_out_ = false;
    timer_.expires_after(buffer_.size() > 0 ? s_.opt.request_timeout : s_.opt.idle_timeout);
    timer_.async_wait([self = this->shared_from_this()](beast::error_code ec) {
      if (ec) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      beast::get_lowest_layer(self->stream_).socket().cancel(ignored);
    });
    http::async_read(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    timer_.cancel();
    if (timed_out_) {
      if (parser_->got_some() || buffer_.size() > 0) return reply_error(ApiError::timeout(), "", false);
      return close();  // an idle keep-alive connection
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
        ec == net::ssl::error::stream_truncated) {
      return close();
    }
    if (ec == http::error::header_limit) return reply_error(ApiError::headers_too_large(), "", false);
    if (ec == http::error::body_limit) return reply_error(ApiError::too_large(), "", false);
    if (ec) return reply_error(ApiError::bad_request("Malformed HTTP request.", "bad_http"), "", false);
    req_ = parser_->release();
    handle();
  }

  // ---- writing simple responses ----------------------------------------------------------
  void reply(int status, std::string body, const std::string& content_type, const std::string& route, bool keep_alive,
             int retry_after = 0) {
    s_.metrics.record_http(route.empty() ? "other" : route, status);
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), req_.version());
    res->set(http::field::server, "lmserve");
    res->set(http::field::content_type, content_type);
    if (retry_after > 0) res->set(http::field::retry_after, std::to_string(retry_after));
    res->keep_alive(keep_alive && req_.keep_alive());
    res->body() = std::move(body);
    res->prepare_payload();
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(60));
    http::async_write(stream_, *res, [self = this->shared_from_this(), res](beast::error_code ec, std::size_t) {
      if (ec || !res->keep_alive()) return self->close();
      self->read();
    });
  }

  void reply_json(int status, const std::string& body, const std::string& route) { reply(status, body, "application/json", route, true); }
  void reply_error(const ApiError& e, const std::string& route, bool keep_alive = true) {
    reply(e.status, e.body(), "application/json", route, keep_alive, e.retry_after);
  }

  void close() {
    beast::error_code ec;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_both, ec);
    beast::get_lowest_layer(stream_).socket().close(ec);
  }

  // ---- routing -------------------------------------------------------------------------
  void handle() {
    const std::string route = route_of(std::string(req_.target()));
    const auto method = req_.method();
    auto needs = [&](http::verb v) {
      if (method == v) return true;
      reply_error(ApiError::method_not_allowed(), route);
      return false;
    };
    const bool open_route = route == "/health" || (route == "/metrics" && !s_.opt.metrics_require_key);
    if (!s_.opt.api_key.empty() && !open_route &&
        !key_matches(std::string(req_[http::field::authorization]), s_.opt.api_key)) {
      return reply_error(ApiError::unauthorized(), route);
    }
    if (route == "/health") {
      if (!needs(http::verb::get)) return;
      bool alive = s_.engine->alive();
      return reply(alive ? 200 : 503, alive ? "" : ApiError::unavailable("The engine is not running.").body(), "application/json",
                   route, true);
    }
    if (route == "/ready") {
      if (!needs(http::verb::get)) return;
      bool ready = s_.engine->alive() && !s_.draining;
      return reply(ready ? 200 : 503, ready ? "" : ApiError::unavailable("The server is not ready.").body(), "application/json", route,
                   true);
    }
    if (route == "/version") {
      if (!needs(http::verb::get)) return;
      return reply_json(200, ojson{{"version", std::string(build_info().version)}, {"commit", std::string(build_info().git_commit)}}.dump(),
                        route);
    }
    if (route == "/metrics") {
      if (!needs(http::verb::get)) return;
      return reply(200,
                   s_.metrics.render(s_.engine->stats(), s_.opt.served_model_name, s_.engine->options().scheduler.kv_watermark,
                                     s_.engine->kv_config().block_size,
                                     std::string(backend::kv_dtype_name(s_.engine->kv_config().dtype)), s_.engine->memory_plan(),
                                     s_.opt.gpu_memory ? s_.opt.gpu_memory() : std::vector<GpuMemorySample>{}) +
                       "# HELP lmserve:generation_requests_in_flight Completion requests being served now.\n"
                       "# TYPE lmserve:generation_requests_in_flight gauge\nlmserve:generation_requests_in_flight " +
                       std::to_string(s_.generations.load()) +
                       "\n# HELP lmserve:generation_requests_in_flight_peak The most completion requests served at once since start.\n"
                       "# TYPE lmserve:generation_requests_in_flight_peak gauge\nlmserve:generation_requests_in_flight_peak " +
                       std::to_string(s_.generations_peak.load()) + "\n",
                   "text/plain; version=0.0.4; charset=utf-8", route, true);
    }
    if (route == "/v1/models") {
      if (!needs(http::verb::get)) return;
      ojson model{{"id", s_.opt.served_model_name}, {"object", "model"}, {"created", std::time(nullptr)}, {"owned_by", "lmserve"},
                  {"root", s_.opt.served_model_name}, {"parent", nullptr},
                  {"max_model_len", s_.engine->options().scheduler.max_model_len}};
      return reply_json(200, ojson{{"object", "list"}, {"data", ojson::array({model})}}.dump(), route);
    }
    if (route == "/tokenize" || route == "/detokenize" || route == "/v1/chat/completions" || route == "/v1/completions") {
      if (!needs(http::verb::post)) return;
      ojson body = ojson::parse(req_.body(), nullptr, false);
      if (body.is_discarded()) {
        return reply_error(ApiError::bad_request("The request body is not valid JSON (or not valid UTF-8).", "invalid_json"), route);
      }
      if (!body.is_object()) return reply_error(ApiError::bad_request("The request body must be a JSON object.", "invalid_body"), route);
      if (body.contains("model") && !body["model"].is_null()) {
        if (!body["model"].is_string()) return reply_error(ApiError::bad_request("'model' must be a string.", "invalid_type", "model"), route);
        if (body["model"].get<std::string>() != s_.opt.served_model_name) {
          return reply_error(ApiError::not_found("The model does not exist on this server."), route);
        }
      }
      if (route == "/tokenize") return tokenize(body, route);
      if (route == "/detokenize") return detokenize(body, route);
      return generate(body, route == "/v1/chat/completions", route);
    }
    return reply_error(ApiError::not_found("Unknown route."), route);
  }

  void tokenize(const ojson& body, const std::string& route) {
    std::vector<std::int32_t> ids;
    if (body.contains("messages")) {
      auto p = parse_request(body, true);
      if (!p) return reply_error(p.error(), route);
      auto prompt = render_chat(*p);
      if (!prompt) return reply_error(prompt.error(), route);
      ids = std::move(*prompt);
    } else if (body.contains("prompt") && body["prompt"].is_string()) {
      bool add = body.value("add_special_tokens", true);
      ids = s_.tokenizer->encode(body["prompt"].get<std::string>(), {.add_special_tokens = add});
    } else {
      return reply_error(ApiError::bad_request("'prompt' must be a string (or send 'messages').", "invalid_type", "prompt"), route);
    }
    reply_json(200, ojson{{"count", ids.size()}, {"max_model_len", s_.engine->options().scheduler.max_model_len}, {"tokens", ids}}.dump(),
               route);
  }

  void detokenize(const ojson& body, const std::string& route) {
    if (!body.contains("tokens") || !body["tokens"].is_array()) {
      return reply_error(ApiError::bad_request("'tokens' must be a list of token ids.", "invalid_type", "tokens"), route);
    }
    std::vector<std::int32_t> ids;
    const auto vocab = static_cast<std::int64_t>(s_.tokenizer->vocab_size());
    for (const auto& t : body["tokens"]) {
      if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() >= vocab) {
        return reply_error(ApiError::bad_request("'tokens' holds an id outside the vocabulary.", "invalid_value", "tokens"), route);
      }
      ids.push_back(t.get<std::int32_t>());
    }
    reply_json(200, ojson{{"prompt", s_.tokenizer->decode(ids, false)}}.dump(-1, ' ', false, ojson::error_handler_t::replace), route);
  }

  Expected<std::vector<std::int32_t>, ApiError> render_chat(const ParsedRequest& p) {
    if (!s_.chat_template) return Unexpected<ApiError>(ApiError::bad_request("This model has no chat template.", "no_chat_template"));
    auto rendered = s_.chat_template->render(p.chat_request);
    if (!rendered) {
      const std::string& m = rendered.error().message();
      const std::string prefix = "raise_exception: ";
      if (m.starts_with(prefix)) return Unexpected<ApiError>(ApiError::bad_request(m.substr(prefix.size()), "chat_template_error"));
      return Unexpected<ApiError>(ApiError::bad_request("The chat template could not render these messages.", "chat_template_error"));
    }
    auto segments = rendered->segments();
    return s_.tokenizer->encode_segments(segments, false);
  }

  // ---- generation ----------------------------------------------------------------------
  void generate(const ojson& body, bool chat, const std::string& route) {
    if (s_.draining) return reply_error(ApiError::unavailable("The server is shutting down."), route);
    auto parsed = parse_request(body, chat);
    if (!parsed) return reply_error(parsed.error(), route);
    ParsedRequest& p = *parsed;
    std::vector<std::int32_t> prompt;
    if (chat) {
      auto ids = render_chat(p);
      if (!ids) return reply_error(ids.error(), route);
      prompt = std::move(*ids);
    } else if (p.prompt_text) {
      prompt = s_.tokenizer->encode(*p.prompt_text);
    } else {
      prompt = p.prompt_ids;
      for (auto t : prompt) {
        if (t >= s_.engine->model_config().vocab_size) {
          return reply_error(ApiError::bad_request("'prompt' holds a token id outside the vocabulary.", "invalid_value", "prompt"), route);
        }
      }
    }
    if (prompt.empty()) return reply_error(ApiError::bad_request("The prompt is empty after tokenization.", "invalid_value", "prompt"), route);
    const std::int64_t max_len = s_.engine->options().scheduler.max_model_len;
    const auto n_prompt = static_cast<std::int64_t>(prompt.size());
    if (!p.max_tokens_given) p.params.max_tokens = std::max<std::int64_t>(1, max_len - n_prompt);
    if (n_prompt + p.params.max_tokens > max_len) {
      return reply_error(ApiError::bad_request("This model's maximum context length is " + std::to_string(max_len) +
                                                   " tokens. However, you requested " + std::to_string(n_prompt + p.params.max_tokens) +
                                                   " tokens (" + std::to_string(n_prompt) + " in the messages, " +
                                                   std::to_string(p.params.max_tokens) +
                                                   " in the completion). Please reduce the length of the messages or completion.",
                                               "context_length_exceeded"),
                         route);
    }
    std::string lane(req_["x-lmserve-lane"]);
    if (lane.empty()) lane = p.lane;
    auto sub = s_.engine->submit({.prompt = prompt, .params = p.params, .lane = lane, .priority = p.priority, .cache_salt = p.cache_salt});
    if (!sub) {
      const auto& e = sub.error();
      if (e.rejection != engine::Rejection::kNone) s_.metrics.record_rejection(std::string(engine::rejection_name(e.rejection)), lane);
      if (e.rejection == engine::Rejection::kQueueFull) return reply_error(ApiError::overloaded(e.status.message(), "queue_full"), route);
      if (e.rejection == engine::Rejection::kShuttingDown) return reply_error(ApiError::unavailable(e.status.message()), route);
      if (e.rejection == engine::Rejection::kExceedsMaxModelLen || e.rejection == engine::Rejection::kPromptTooLong ||
          e.rejection == engine::Rejection::kExceedsKvCapacity) {
        return reply_error(ApiError::bad_request(e.status.message(), "context_length_exceeded"), route);
      }
      return reply_error(ApiError::from_status(e.status), route);
    }
    gen_.emplace();
    const int now = ++s_.generations;
    for (int peak = s_.generations_peak.load(); now > peak && !s_.generations_peak.compare_exchange_weak(peak, now);) {
    }
    gen_->route = route;
    gen_->lane = lane;
    gen_->id = sub->id;
    gen_->stream = sub->stream;
    gen_->parsed = std::move(p);
    gen_->writer.emplace(chat, s_.new_id(chat ? "chatcmpl" : "cmpl"), static_cast<std::int64_t>(std::time(nullptr)),
                         s_.opt.served_model_name, s_.tokenizer.get());
    gen_->choices.resize(static_cast<std::size_t>(gen_->parsed.params.n));
    gen_->started = Clock::now();
    gen_->last_token.assign(gen_->choices.size(), Clock::time_point{});
    beast::get_lowest_layer(stream_).expires_never();
    std::weak_ptr<Session> weak = this->shared_from_this();
    auto ex = stream_.get_executor();
    sub->stream->set_notify([weak, ex] {
      net::post(ex, [weak] {
        if (auto self = weak.lock()) self->pump();
      });
    });
    watch_disconnect();
    if (gen_->parsed.stream) start_stream();
    pump();
  }

  // While generating: a readable socket with nothing to read means the client left.
  void watch_disconnect() {
    beast::get_lowest_layer(stream_).socket().async_wait(tcp::socket::wait_read, [self = this->shared_from_this()](beast::error_code ec) {
      if (!self->gen_ || self->gen_->done) return;
      auto& socket = beast::get_lowest_layer(self->stream_).socket();
      beast::error_code ec2;
      std::size_t avail = socket.available(ec2);
      if (!ec && !ec2 && avail == 0) {
        // Readiness can be stale (the bytes that raised it were already taken by a read, e.g.
        // the TLS layer's): only a peek that returns 0 is the client's end of stream.
        char byte;
        ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->watch_disconnect();
        if (n > 0) avail = static_cast<std::size_t>(n);
      }
      if (ec || ec2 || avail == 0) {
        self->s_.engine->abort(self->gen_->id);
        self->gen_->client_gone = true;
        return;
      }
      // TLS records cannot be taken off the socket here: stop watching (a write will notice).
      if constexpr (kTls) return;
      // Pipelined bytes of the next request: keep them for the parser (bounded).
      if (self->buffer_.size() + avail > self->s_.opt.max_body_bytes + self->s_.opt.max_header_bytes) {
        self->s_.engine->abort(self->gen_->id);
        self->gen_->client_gone = true;
        return;
      }
      auto buf = self->buffer_.prepare(avail);
      std::size_t n = beast::get_lowest_layer(self->stream_).socket().read_some(buf, ec2);
      self->buffer_.commit(n);
      if (ec2) {
        self->s_.engine->abort(self->gen_->id);
        self->gen_->client_gone = true;
        return;
      }
      self->watch_disconnect();
    });
  }

  void start_stream() {
    auto res = std::make_shared<http::response<http::empty_body>>(http::status::ok, req_.version());
    res->set(http::field::server, "lmserve");
    res->set(http::field::content_type, "text/event-stream; charset=utf-8");
    res->set(http::field::cache_control, "no-cache");
    res->set("X-Accel-Buffering", "no");
    res->keep_alive(req_.keep_alive());
    res->chunked(true);
    auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*res);
    gen_->writing = true;
    http::async_write_header(stream_, *sr, [self = this->shared_from_this(), res, sr](beast::error_code ec, std::size_t) {
      self->gen_->writing = false;
      if (ec) return self->on_client_gone();
      self->gen_->keep_alive = res->keep_alive();
      self->flush();
    });
  }

  void send(std::string chunk) {
    gen_->out.push_back(std::move(chunk));
    flush();
  }

  void flush() {
    if (!gen_ || gen_->writing || gen_->out.empty()) {
      if (gen_ && !gen_->writing && gen_->out.empty() && gen_->finished_stream) finish_stream();
      return;
    }
    auto data = std::make_shared<std::string>(std::move(gen_->out.front()));
    gen_->out.pop_front();
    gen_->writing = true;
    net::async_write(stream_, http::make_chunk(net::buffer(*data)), [self = this->shared_from_this(), data](beast::error_code ec, std::size_t) {
      self->gen_->writing = false;
      if (ec) return self->on_client_gone();
      self->flush();
    });
  }

  void finish_stream() {
    gen_->writing = true;
    uncount_generation();
    net::async_write(stream_, http::make_chunk_last(), [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
      bool keep = self->gen_->keep_alive && !ec;
      self->end_generation();
      if (!keep) return self->close();
      self->read();
    });
  }

  void on_client_gone() {
    if (!gen_) return;
    if (!gen_->done) s_.engine->abort(gen_->id);
    gen_->client_gone = true;
    gen_->out.clear();
    if (gen_->done) {
      end_generation();
      close();
    }
  }

  void pump() {
    if (!gen_ || gen_->done) return;
    engine::StreamEvent e;
    bool timed_out = false;
    while (gen_->stream->next(&e, std::chrono::milliseconds(0), &timed_out)) on_event(std::move(e));
    if (!timed_out && !gen_->done) complete();  // all choices finished
  }

  void on_event(engine::StreamEvent e) {
    auto& g = *gen_;
    auto& c = g.choices[static_cast<std::size_t>(e.index)];
    const auto now = Clock::now();
    if (!e.token_ids.empty()) {
      auto& last = g.last_token[static_cast<std::size_t>(e.index)];
      if (last == Clock::time_point{}) {
        if (g.first_token == Clock::time_point{}) g.first_token = now;
      } else {
        g.itl.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
    }
    c.token_ids.insert(c.token_ids.end(), e.token_ids.begin(), e.token_ids.end());
    c.logprobs.insert(c.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
    c.text += e.text;
    if (e.finish != engine::FinishReason::kNone) {
      c.finish = e.finish;
      c.stop_reason = e.stop_reason;
      g.usage.prompt_tokens = e.prompt_tokens;
      g.usage.completion_tokens += e.completion_tokens;
      g.usage.cached_tokens = e.cached_prompt_tokens;
      if (e.finish == engine::FinishReason::kError) g.error = e.error;
    }
    if (g.parsed.stream && !g.client_gone) {
      if (g.parsed.chat && !g.role_sent[e.index]) {
        send(g.writer->role_chunk(e.index));
        g.role_sent[e.index] = true;
      }
      if (e.finish == engine::FinishReason::kError) {
        send(ResponseWriter::error_event(ApiError::internal("The engine failed while generating.")));
      } else if (!e.text.empty() || !e.token_ids.empty() || e.finish != engine::FinishReason::kNone) {
        send(g.writer->delta_chunk(e.index, e.text, e.logprobs, e.finish, g.parsed.logprobs));
      }
    }
  }

  void complete() {
    auto& g = *gen_;
    g.done = true;
    record();
    if (g.client_gone) {
      end_generation();
      return close();
    }
    if (g.parsed.stream) {
      if (g.parsed.include_usage) send(g.writer->usage_chunk(g.usage));
      send(ResponseWriter::done());
      g.finished_stream = true;
      flush();
      return;
    }
    const std::string route = g.route;
    if (!g.error.empty()) {
      end_generation();
      return reply_error(ApiError::internal("The engine failed while generating."), route);
    }
    std::string body = g.writer->full(g.choices, g.usage, g.parsed.logprobs);
    end_generation();
    beast::get_lowest_layer(stream_).socket().cancel();  // stop the disconnect watcher
    reply_json(200, body, route);
  }

  void record() {
    auto& g = *gen_;
    RequestRecord r;
    auto times = g.stream->times();
    const auto end = Clock::now();
    auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
    r.queue_s = times.first_scheduled != Clock::time_point{} ? secs(times.first_scheduled - times.arrival) : secs(end - g.started);
    r.ttft_s = g.first_token != Clock::time_point{} ? secs(g.first_token - g.started) : 0;
    r.e2e_s = secs(end - g.started);
    r.itl_s = g.itl;
    r.prompt_tokens = g.usage.prompt_tokens;
    r.generation_tokens = g.usage.completion_tokens;
    engine::FinishReason worst = engine::FinishReason::kStop;
    for (const auto& c : g.choices) {
      if (c.finish == engine::FinishReason::kAbort || c.finish == engine::FinishReason::kError) worst = c.finish;
      if (worst == engine::FinishReason::kStop && c.finish == engine::FinishReason::kLength) worst = c.finish;
    }
    r.finish_reason = finish_reason_name(worst);
    s_.metrics.record_request(r);
    s_.metrics.record_http(g.route, g.client_gone ? 499 : 200);
    ojson line{{"event", "request"}, {"id", g.writer ? g.writer->id() : std::to_string(g.id)},
               {"lane", g.lane.empty() ? s_.engine->options().scheduler.lanes.back().name : g.lane}, {"priority", g.parsed.priority},
               {"status", g.client_gone ? "client_gone" : "ok"}, {"prompt_tokens", r.prompt_tokens},
               {"completion_tokens", r.generation_tokens}, {"queue_s", r.queue_s}, {"ttft_s", r.ttft_s}, {"total_s", r.e2e_s},
               {"finish_reason", r.finish_reason}};
    if (s_.opt.log_prompts) {  // off by default: prompts can hold customer data
      if (g.parsed.chat) {
        line["messages"] = g.parsed.chat_request.messages;
      } else if (g.parsed.prompt_text) {
        line["prompt"] = *g.parsed.prompt_text;
      }
    }
    spdlog::info("{}", line.dump(-1, ' ', false, ojson::error_handler_t::replace));
  }

  void end_generation() {
    uncount_generation();
    gen_.reset();
  }

  // A generation stops counting as in flight once its last bytes are queued: a client may
  // start its next request as soon as it reads them, before our write completes.
  void uncount_generation() {
    if (gen_ && gen_->counted) {
      gen_->counted = false;
      --s_.generations;
    }
  }

  struct Generation {
    std::string route;
    std::string lane;  // as submitted (header or field); empty: the last lane
    engine::RequestId id = 0;
    std::shared_ptr<engine::RequestStream> stream;
    ParsedRequest parsed;
    std::optional<ResponseWriter> writer;
    std::vector<ChoiceResult> choices;
    std::map<std::int32_t, bool> role_sent;
    Usage usage;
    std::string error;
    Clock::time_point started, first_token;
    std::vector<Clock::time_point> last_token;
    std::vector<double> itl;
    std::deque<std::string> out;
    bool writing = false, done = false, finished_stream = false, client_gone = false, keep_alive = true;
    bool counted = true;  // in Impl::generations
  };

  Stream stream_;
  net::steady_timer timer_;
  bool timed_out_ = false;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> req_;
  Server::Impl& s_;
  std::optional<Generation> gen_;
};

}  // namespace

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted) return;
      return accept();
    }
    if (++connections > opt.max_connections) {
      --connections;
      // Too many connections: a short 503 and close, without reading the request.
      static const std::string res = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                                     "Connection: close\r\nContent-Length: " +
                                     std::to_string(ApiError::unavailable("Too many connections.").body().size()) + "\r\n\r\n" +
                                     ApiError::unavailable("Too many connections.").body();
      beast::error_code wec;
      net::write(socket, net::buffer(res), wec);
      socket.close(wec);
      return accept();
    }
    if (ssl) {
      std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(*this, std::move(socket), *ssl)->start();
    } else {
      std::make_shared<Session<beast::tcp_stream>>(*this, std::move(socket))->start();
    }
    accept();
  });
}

void Server::Impl::begin_shutdown() {
  if (draining.exchange(true)) return;
  spdlog::info("shutdown: not ready; finishing in-flight requests for up to {} s", opt.shutdown_timeout.count());
  shutdown_thread = std::thread([this] {
    engine->shutdown(std::chrono::duration_cast<std::chrono::milliseconds>(opt.shutdown_timeout));
    net::post(ioc, [this] {
      beast::error_code ec;
      acceptor.close(ec);
    });
    // Give sessions a moment to write the final events, then stop.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    work.reset();
    ioc.stop();
  });
}

Server::Server(ServerOptions options, std::unique_ptr<engine::Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer,
               std::optional<text::ChatTemplate> chat_template)
    : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->engine = std::move(engine);
  impl_->tokenizer = std::move(tokenizer);
  impl_->chat_template = std::move(chat_template);
}

Server::~Server() {
  if (impl_->shutdown_thread.joinable()) impl_->shutdown_thread.join();
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) {
    if (t.joinable()) t.join();
  }
}

Status Server::start() {
  beast::error_code ec;
  if (!impl_->opt.ssl_certfile.empty() || !impl_->opt.ssl_keyfile.empty()) {
    if (impl_->opt.ssl_certfile.empty() || impl_->opt.ssl_keyfile.empty()) {
      return Status(StatusCode::kInvalidArgument, "TLS needs both --ssl-certfile and --ssl-keyfile");
    }
    auto& ctx = impl_->ssl.emplace(net::ssl::context::tls_server);
    ctx.set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 | net::ssl::context::no_sslv3 |
                    net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1);
    ctx.use_certificate_chain_file(impl_->opt.ssl_certfile, ec);
    if (ec) return Status(StatusCode::kInvalidArgument, "--ssl-certfile: cannot use " + impl_->opt.ssl_certfile + ": " + ec.message());
    ctx.use_private_key_file(impl_->opt.ssl_keyfile, net::ssl::context::pem, ec);
    if (ec) return Status(StatusCode::kInvalidArgument, "--ssl-keyfile: cannot use " + impl_->opt.ssl_keyfile + ": " + ec.message());
  }
  auto addr = net::ip::make_address(impl_->opt.host, ec);
  if (ec) return Status(StatusCode::kInvalidArgument, "--host '" + impl_->opt.host + "' is not an IP address");
  tcp::endpoint ep(addr, static_cast<unsigned short>(impl_->opt.port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Status(StatusCode::kUnavailable, "cannot listen on " + impl_->opt.host + ":" + std::to_string(impl_->opt.port) + ": " + ec.message());
  impl_->bound_port = a.local_endpoint().port();
  impl_->work.emplace(net::make_work_guard(impl_->ioc));
  impl_->accept();
  return Status::ok();
}

int Server::port() const { return impl_->bound_port; }

void Server::shutdown() {
  net::post(impl_->ioc, [impl = impl_.get()] { impl->begin_shutdown(); });
}

void Server::run(bool handle_signals) {
  // Both live until run() returns: the handler re-arms itself through them.
  std::optional<net::signal_set> signals;
  std::function<void(beast::error_code, int)> on_signal = [this, &signals, &on_signal](beast::error_code ec, int) {
    if (ec) return;
    if (++impl_->signals > 1) std::_Exit(1);  // a second signal: exit at once
    impl_->begin_shutdown();
    signals->async_wait(on_signal);
  };
  if (handle_signals) {
    signals.emplace(impl_->ioc, SIGINT, SIGTERM);
    signals->async_wait(on_signal);
  }
  const int n = std::max(1, impl_->opt.io_threads);
  for (int i = 1; i < n; ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  impl_->ioc.run();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace lmserve::server
