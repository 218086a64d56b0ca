#include "fake_upstream.h"

#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "server/http/asio.h"

namespace lmserve::testing {

namespace http = server::http;

namespace {

// Runs fn after ms on the exchange's strand (at once, still posted, for 0).
void after(const http::Exchange& ex, int ms, std::function<void()> fn) {
  if (ms <= 0) return ex.post(std::move(fn));
  auto t = std::make_shared<boost::asio::steady_timer>(http::executor_of(ex), std::chrono::milliseconds(ms));
  t->async_wait([t, fn = std::move(fn)](const boost::system::error_code&) { fn(); });
}

}  // namespace

FakeUpstream::FakeUpstream(std::string name, int io_threads, int port) : name_(std::move(name)) {
  options_.port = port;
  options_.io_threads = io_threads;
  options_.server_header = "fake-upstream";
  options_.shutdown_timeout = std::chrono::seconds(1);
}

FakeUpstream::~FakeUpstream() { stop(); }

void FakeUpstream::start() {
  transport_ = std::make_unique<http::Transport>(options_, *this);
  if (!transport_->start().is_ok()) throw std::runtime_error("fake upstream: cannot listen");
  port_ = transport_->port();
  thread_ = std::thread([this] { transport_->run(false); });
}

void FakeUpstream::stop() {
  if (!transport_) return;
  transport_->shutdown();
  if (thread_.joinable()) thread_.join();
  transport_.reset();  // closes every connection still open
}

http::Response FakeUpstream::error_response(http::TransportError) { return {.status = 400, .body = "{}"}; }

void FakeUpstream::handle(http::Exchange ex) {
  const auto& req = ex.request();
  if (req.path == "/health") return ex.reply({.status = behaviour.healthy ? 200 : 503, .content_type = "text/plain", .body = ""});
  if (req.path == "/metrics") {
    const auto w = waiting.load();
    return ex.reply({.status = 200,
                     .content_type = "text/plain",
                     .body = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} " + std::to_string(w) +
                             "\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.1\n"});
  }
  ++requests;
  {
    std::lock_guard lock(seen_mu);
    seen_lane = req.header("x-lmserve-lane");
    seen_authorization = req.header("authorization");
    seen_headers = req.headers;
  }
  const auto j = nlohmann::json::parse(req.body, nullptr, false);
  const bool stream = behaviour.always_stream || (!j.is_discarded() && j.value("stream", false));
  // As vLLM: a last event with the usage when the client asks for it.
  const bool usage = stream && j.contains("stream_options") && j["stream_options"].is_object() && j["stream_options"].value("include_usage", false);
  ex.watch_disconnect([this] { ++disconnects; });
  const int status = behaviour.status;
  if (status != 200) {
    http::Response r{.status = status, .body = R"({"error":{"message":"fake failure","type":"server_error","param":null,"code":"fake"}})"};
    if (status == 429 || status == 503) r.headers.emplace_back("Retry-After", std::to_string(behaviour.retry_after_s.load()));
    return after(ex, behaviour.first_byte_delay_ms, [ex, r]() mutable { ex.reply(r); });
  }
  if (behaviour.max_concurrent > 0) {
    std::lock_guard lock(mu_);
    if (running_ >= behaviour.max_concurrent) {
      ++waiting;
      queue_.push_back([this, ex, stream, usage] {
        --waiting;
        ex.post([this, ex, stream, usage] { serve(ex, stream, usage); });
      });
      return;
    }
    ++running_;
  }
  serve(ex, stream, usage);
}

void FakeUpstream::release_slot() {
  std::function<void()> next;
  {
    std::lock_guard lock(mu_);
    if (behaviour.max_concurrent <= 0) return;
    if (queue_.empty()) {
      --running_;
      return;
    }
    next = std::move(queue_.front());
    queue_.pop_front();
  }
  next();  // the slot passes to the next request
}

void FakeUpstream::serve(http::Exchange ex, bool stream, bool usage) {
  const int delay = behaviour.first_byte_delay_ms + behaviour.service_ms;
  auto release = std::make_shared<std::function<void()>>([this] { release_slot(); });
  if (!stream) {
    return after(ex, delay, [this, ex, release]() mutable {
      const int n = behaviour.body_bytes;
      nlohmann::json body = {{"id", "cmpl-fake"}, {"object", "text_completion"}, {"model", "m"}, {"served_by", name_},
                             {"choices", {{{"index", 0}, {"text", n > 0 ? std::string(static_cast<std::size_t>(n), 'x') : "hello"}, {"finish_reason", "length"}}}},
                             {"usage", {{"prompt_tokens", 3}, {"completion_tokens", 1}, {"total_tokens", 4}}}};
      ex.reply({.status = 200, .body = body.dump()});
      (*release)();
    });
  }
  after(ex, delay, [this, ex, release, usage]() mutable {
    ex.start_stream({.status = 200, .content_type = "text/event-stream", .headers = {{"Cache-Control", "no-cache"}}});
    stream_from(ex, 0, release, usage);
  });
}

void FakeUpstream::stream_from(http::Exchange ex, int i, std::shared_ptr<std::function<void()>> release, bool usage) {
  if (!ex.active()) return (*release)();
  if (i == behaviour.drop_after_chunks) {
    ex.abort();
    return (*release)();
  }
  if (i == behaviour.stall_after_chunks) return (*release)();  // never another byte
  if (i >= behaviour.chunks) {
    if (usage) {
      nlohmann::json ev = {{"id", "cmpl-fake"}, {"object", "text_completion"}, {"choices", nlohmann::json::array()},
                           {"usage", {{"prompt_tokens", 3}, {"completion_tokens", i}, {"total_tokens", 3 + i}}}};
      ex.send("data: " + ev.dump() + "\n\n");
    }
    ex.send("data: [DONE]\n\n");
    ex.end_stream();
    return (*release)();
  }
  // A replica that honours backpressure: nothing more while the client is 256 KiB behind.
  if (ex.queued_bytes() > 256 * 1024) return ex.when_drained([this, ex, i, release, usage] { stream_from(ex, i, release, usage); });
  const int pad = behaviour.event_bytes;
  std::string text = "t" + std::to_string(i);
  if (pad > 0) text.resize(static_cast<std::size_t>(pad), 'x');
  nlohmann::json ev = {{"id", "cmpl-fake"}, {"object", "text_completion"}, {"served_by", name_},
                       {"choices", {{{"index", 0}, {"text", text}, {"finish_reason", nullptr}}}}};
  ex.send("data: " + ev.dump() + "\n\n");
  ++events_sent;
  after(ex, behaviour.chunk_delay_ms, [this, ex, i, release, usage] { stream_from(ex, i + 1, release, usage); });
}

}  // namespace lmserve::testing
