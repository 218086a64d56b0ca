// lmserve serve: the OpenAI-compatible HTTP server.
//
// Threading model: `io_threads` threads run one Asio io_context. Each connection is a
// Session whose handlers all run on its own strand, so a session is single-threaded and
// nothing else touches it; no thread is ever dedicated to a connection. HTTP threads never
// touch the model: a generation request becomes an engine submit(), and the engine's
// per-request stream wakes the session (set_notify posts onto its strand), which then drains
// the stream without blocking. While a request generates, the session watches its socket;
// a client that goes away is aborted in the engine at once (its KV blocks are freed within
// one engine step).
//
// Shutdown: the first SIGTERM/SIGINT makes /ready 503 and new generations 503, lets in-flight
// requests finish for up to shutdown_timeout, aborts the rest (streams get a final
// finish_reason "abort" event), then returns from run(). A second signal exits at once.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "engine/engine.h"
#include "server/metrics.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lmserve::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see Server::port())
  std::string served_model_name = "demo";
  std::string api_key;  // empty: no authentication
  bool metrics_require_key = false;
  int io_threads = 2;
  std::size_t max_connections = 10000;
  std::size_t max_header_bytes = 16 * 1024;
  std::size_t max_body_bytes = 8 * 1024 * 1024;
  std::chrono::seconds request_timeout{30};  // to receive one whole request (headers + body)
  std::chrono::seconds idle_timeout{60};     // keep-alive connection with no request
  std::chrono::seconds shutdown_timeout{30};
  bool log_prompts = false;
  std::string ssl_certfile, ssl_keyfile;  // both set: HTTPS
  // Per-GPU memory for /metrics (a DeviceMemoryMonitor's latest()); empty: none exported.
  std::function<std::vector<GpuMemorySample>()> gpu_memory;
};

class Server {
 public:
  Server(ServerOptions options, std::unique_ptr<engine::Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer,
         std::optional<text::ChatTemplate> chat_template);
  ~Server();

  // Binds and listens. The port actually bound is port() afterwards.
  Status start();
  int port() const;
  // Serves until shutdown completes. Installs SIGINT/SIGTERM handling when `handle_signals`.
  void run(bool handle_signals = true);
  // Starts the graceful shutdown (as the first signal does). Thread-safe.
  void shutdown();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lmserve::server
