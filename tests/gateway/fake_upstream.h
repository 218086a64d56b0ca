// A replica stand-in for the gateway's tests and its overhead benchmark: an OpenAI-shaped
// /v1/completions on the real transport, with faults to order (an error status, a slow first
// token, a drop or a stall mid-stream, a failing /health) and an optional queue (one request at a
// time, the rest waiting and counted in /metrics as vllm:num_requests_waiting), so that a slow
// replica looks to the gateway as a loaded `serve` does. Streams end with a usage event when the
// request asks for it (stream_options.include_usage).
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "server/http/transport.h"

namespace lmserve::testing {

struct FakeBehaviour {
  std::atomic<int> status{200};           // answer status; 429 and 503 carry Retry-After
  std::atomic<int> retry_after_s{1};
  std::atomic<int> first_byte_delay_ms{0};  // before the answer (streamed: before the first event)
  std::atomic<int> chunks{3};             // streamed events before [DONE]
  std::atomic<int> chunk_delay_ms{0};     // between events
  std::atomic<int> drop_after_chunks{-1};   // close the connection after this many events
  std::atomic<int> stall_after_chunks{-1};  // stop sending after this many events (and never end)
  std::atomic<bool> healthy{true};        // /health answers 200, else 503
  std::atomic<int> service_ms{0};         // with max_concurrent: time each request holds a slot
  std::atomic<int> max_concurrent{0};     // > 0: requests beyond it wait in a queue
  std::atomic<int> body_bytes{0};         // > 0: the completion text is this many bytes
  std::atomic<int> event_bytes{0};        // > 0: each streamed event's text is this many bytes
  std::atomic<bool> always_stream{false};  // streams whatever the request asks ("stream": false too)
};

class FakeUpstream : public server::http::Application {
 public:
  explicit FakeUpstream(std::string name, int io_threads = 1, int port = 0);
  ~FakeUpstream() override;

  void start();  // binds (port 0: any free port) and serves on threads of its own
  void stop();   // closes the listener and every connection
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  FakeBehaviour behaviour;
  std::atomic<std::int64_t> requests{0};     // completions received
  std::atomic<std::int64_t> disconnects{0};  // clients (the gateway) gone before the end
  std::atomic<std::int64_t> waiting{0};      // queued behind max_concurrent
  std::atomic<std::int64_t> events_sent{0};  // streamed events handed to the transport
  // The last completion request's x-lmserve-lane and Authorization headers.
  std::mutex seen_mu;
  std::string seen_lane, seen_authorization;
  std::vector<std::pair<std::string, std::string>> seen_headers;  // the last request's, all of them

  void handle(server::http::Exchange ex) override;
  server::http::Response error_response(server::http::TransportError) override;
  void drain(std::chrono::milliseconds) override {}

 private:
  void serve(server::http::Exchange ex, bool stream, bool usage);
  void stream_from(server::http::Exchange ex, int i, std::shared_ptr<std::function<void()>> release, bool usage);
  void release_slot();

  const std::string name_;
  server::http::TransportOptions options_;
  std::unique_ptr<server::http::Transport> transport_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  int running_ = 0;
  std::deque<std::function<void()>> queue_;
};

}  // namespace lmserve::testing
