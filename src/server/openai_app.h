// The OpenAI routes as an http::Application (server.h's Server holds one over a Transport).
// Internal to server/: routes.cpp answers the routes, generation.cpp the completions.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>

#include "engine/engine.h"
#include "server/dashboard.h"
#include "server/errors.h"
#include "server/http/transport.h"
#include "server/metrics.h"
#include "server/server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lmserve::server {

using ojson = nlohmann::ordered_json;
struct ParsedRequest;

class OpenAiApp : public http::Application {
 public:
  OpenAiApp(ServerOptions options, std::unique_ptr<engine::Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer,
            std::optional<text::ChatTemplate> chat_template);
  ~OpenAiApp() override;

  // http::Application
  void handle(http::Exchange ex) override;
  http::Response error_response(http::TransportError error) override;
  void drain(std::chrono::milliseconds grace) override;

  // Set once, before the transport starts: /ready reads its draining().
  void set_transport(const http::Transport* t) { transport_ = t; }

  // Answers and records (lmserve's http counter) under `route`.
  void reply(http::Exchange& ex, int status, std::string body, const std::string& route, const std::string& content_type = "application/json");
  void reply_error(http::Exchange& ex, const ApiError& e, const std::string& route);

  const ServerOptions& options() const { return opt_; }
  engine::Engine& engine() { return *engine_; }
  const text::Tokenizer& tokenizer() const { return *tokenizer_; }
  ServerMetrics& metrics() { return metrics_; }
  bool draining() const { return transport_ && transport_->draining(); }
  std::string new_id(const char* prefix);

  // Completion requests being served now (counted from submit until their last bytes are
  // queued), and the most at once since start: a load test's --max-concurrency shows here.
  void count_generation();
  void uncount_generation() { --generations_; }

  // The chat template applied to the parsed messages, tokenized.
  Expected<std::vector<std::int32_t>, ApiError> render_chat(const ParsedRequest& p) const;

 private:
  void generate(http::Exchange& ex, const ojson& body, bool chat, const std::string& route);  // generation.cpp
  void tokenize(http::Exchange& ex, const ojson& body, const std::string& route);
  void detokenize(http::Exchange& ex, const ojson& body, const std::string& route);
  std::string metrics_text() const;

  ServerOptions opt_;
  std::unique_ptr<engine::Engine> engine_;
  std::shared_ptr<const text::Tokenizer> tokenizer_;
  std::optional<text::ChatTemplate> chat_template_;
  ServerMetrics metrics_;
  const http::Transport* transport_ = nullptr;
  std::atomic<int> generations_{0}, generations_peak_{0};
  std::mutex id_mu_;
  std::mt19937_64 id_rng_{std::random_device{}()};
  std::unique_ptr<Dashboard> dashboard_;  // last: its sampler reads the members above
};

}  // namespace lmserve::server
