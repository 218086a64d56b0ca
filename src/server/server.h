// lmserve serve: the OpenAI-compatible HTTP server — the OpenAI routes (openai_app.h) over the
// shared HTTP transport (http/transport.h, which states the threading model and shutdown).
//
// HTTP threads never touch the model: a generation request becomes an engine submit(), and the
// engine's per-request stream wakes the connection (Exchange::post), which then drains the
// stream without blocking. While a request generates, its socket is watched; a client that goes
// away is aborted in the engine at once (its KV blocks are freed within one engine step).
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
#include "server/http/transport.h"
#include "server/metrics.h"
#include "server/tool_calls.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lmserve::server {

// The transport's options (host, port, limits, timeouts, TLS, shutdown_timeout) and the routes'.
struct ServerOptions : http::TransportOptions {
  std::string served_model_name = "demo";
  std::string api_key;  // empty: no authentication
  bool metrics_require_key = false;
  bool log_prompts = false;
  // Tool calls read from chat outputs (`--tool-call-parser`, `--enable-auto-tool-choice`): a
  // request with tools and tool_choice "auto" needs both, as in vLLM.
  std::optional<ToolParser> tool_call_parser;
  bool enable_auto_tool_choice = false;
  // Per-GPU memory for /metrics (a DeviceMemoryMonitor's latest()); empty: none exported.
  std::function<std::vector<GpuMemorySample>()> gpu_memory;
  double device_memory_limit = 0.95;  // the dashboard's admission line on the memory chart
};

// Start-up: a Server made without its engine listens while the model loads (serve binds before
// loading, so a port in use fails at once and probes get answers): every route answers 503
// "The server is starting" (naming the start-up phase under way; /health and /ready included,
// as a server that is not listening yet would fail them) but /metrics, which shows the phases
// done (lmserve:startup_seconds), and /version. attach() makes it the OpenAI server.
class Server {
 public:
  Server(ServerOptions options, std::unique_ptr<engine::Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer,
         std::optional<text::ChatTemplate> chat_template);
  explicit Server(ServerOptions options);  // starting: attach() the engine when it is ready
  ~Server();

  // The engine is ready: from now on the OpenAI routes answer. Once, from any thread.
  // `gpu_memory` replaces the options' (known once the backend is).
  void attach(std::unique_ptr<engine::Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer,
              std::optional<text::ChatTemplate> chat_template, std::function<std::vector<GpuMemorySample>()> gpu_memory = {});
  // Binds and listens. The port actually bound is port() afterwards.
  Status start();
  int port() const;
  // Serves until shutdown completes. Installs SIGINT/SIGTERM handling when `handle_signals`.
  void run(bool handle_signals = true);
  // Starts the graceful shutdown (as the first signal does). Thread-safe.
  void shutdown();
  // Shutting down (a signal or shutdown() came).
  bool draining() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lmserve::server
