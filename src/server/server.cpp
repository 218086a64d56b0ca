// Server (server.h) and the OpenAI routes other than the completions (generation.cpp):
// authentication, health, readiness, version, metrics, models, tokenize and detokenize.
#include "server/server.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <ctime>

#include "common/build_info.h"
#include "common/json_depth.h"
#include "common/startup.h"
#include "server/openai.h"
#include "server/openai_app.h"

namespace lmserve::server {

namespace {

// GET /version's body.
std::string version_json() { return ojson{{"version", std::string(build_info().version)}, {"commit", std::string(build_info().git_commit)}}.dump(); }

bool key_matches(std::string_view header, const std::string& key) {
  constexpr std::string_view prefix = "Bearer ";
  if (header.size() != prefix.size() + key.size() || !header.starts_with(prefix)) return false;
  unsigned diff = 0;  // constant time over the key
  for (std::size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned>(header[prefix.size() + i] ^ key[i]);
  return diff == 0;
}

}  // namespace

OpenAiApp::OpenAiApp(ServerOptions options, std::unique_ptr<engine::Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer,
                     std::optional<text::ChatTemplate> chat_template)
    : opt_(std::move(options)), engine_(std::move(engine)), tokenizer_(std::move(tokenizer)), chat_template_(std::move(chat_template)) {
  metrics_.declare_lanes(engine_->options().scheduler.lanes);
  dashboard_ = std::make_unique<Dashboard>([this, sampler = std::make_shared<MetricsSampler>()](std::int64_t t) {
    return sampler->sample(metrics_text(), t, opt_.device_memory_limit);
  });
}

OpenAiApp::~OpenAiApp() = default;

std::string OpenAiApp::new_id(const char* prefix) {
  std::lock_guard lock(id_mu_);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s-%016llx%08llx", prefix, static_cast<unsigned long long>(id_rng_()),
                static_cast<unsigned long long>(id_rng_() & 0xffffffffu));
  return buf;
}

void OpenAiApp::count_generation() {
  const int now = ++generations_;
  for (int peak = generations_peak_.load(); now > peak && !generations_peak_.compare_exchange_weak(peak, now);) {
  }
}

void OpenAiApp::reply(http::Exchange& ex, int status, std::string body, const std::string& route, const std::string& content_type) {
  metrics_.record_http(route.empty() ? "other" : route, status);
  ex.reply({.status = status, .content_type = content_type, .body = std::move(body)});
}

void OpenAiApp::reply_error(http::Exchange& ex, const ApiError& e, const std::string& route) {
  metrics_.record_http(route.empty() ? "other" : route, e.status);
  ex.reply(e.response());
}

http::Response OpenAiApp::error_response(http::TransportError error) {
  ApiError e = ApiError::from_transport(error);
  metrics_.record_http("other", e.status);
  return e.response();
}

void OpenAiApp::drain(std::chrono::milliseconds grace) { engine_->shutdown(grace); }

void OpenAiApp::handle(http::Exchange ex) {
  const http::Request& req = ex.request();
  const std::string& route = req.path;
  auto needs = [&](const char* method) {
    if (req.method == method) return true;
    reply_error(ex, ApiError::method_not_allowed(), route);
    return false;
  };
  const bool open_route = route == "/health" || (route == "/metrics" && !opt_.metrics_require_key);
  if (!opt_.api_key.empty() && !open_route && !key_matches(req.header("Authorization"), opt_.api_key)) {
    return reply_error(ex, ApiError::unauthorized(), route);
  }
  if (route == "/health") {
    if (!needs("GET")) return;
    if (engine_->alive()) return reply(ex, 200, "", route);
    return reply_error(ex, ApiError::unavailable("The engine is not running."), route);
  }
  if (route == "/ready") {
    if (!needs("GET")) return;
    if (engine_->alive() && !draining()) return reply(ex, 200, "", route);
    return reply_error(ex, ApiError::unavailable("The server is not ready."), route);
  }
  if (route == "/version") {
    if (!needs("GET")) return;
    return reply(ex, 200, version_json(), route);
  }
  if (route == "/metrics") {
    if (!needs("GET")) return;
    return reply(ex, 200, metrics_text(), route, "text/plain; version=0.0.4; charset=utf-8");
  }
  if (route == "/dashboard" || route == "/dashboard/chart.js" || route == "/dashboard/data") {
    if (!needs("GET")) return;
    if (route == "/dashboard") return reply(ex, 200, std::string(Dashboard::page()), route, "text/html; charset=utf-8");
    if (route == "/dashboard/chart.js") return reply(ex, 200, std::string(Dashboard::chart_js()), route, "text/javascript; charset=utf-8");
    std::int64_t since = 0;  // ?since=MS: the samples after it
    if (const auto q = req.target.find("since="); q != std::string::npos) since = std::strtoll(req.target.c_str() + q + 6, nullptr, 10);
    return reply(ex, 200, dashboard_->data_json(since), route);
  }
  if (route == "/v1/models") {
    if (!needs("GET")) return;
    ojson model{{"id", opt_.served_model_name}, {"object", "model"}, {"created", std::time(nullptr)}, {"owned_by", "lmserve"},
                {"root", opt_.served_model_name}, {"parent", nullptr}, {"max_model_len", engine_->options().scheduler.max_model_len}};
    return reply(ex, 200, ojson{{"object", "list"}, {"data", ojson::array({model})}}.dump(), route);
  }
  if (route == "/tokenize" || route == "/detokenize" || route == "/v1/chat/completions" || route == "/v1/completions") {
    if (!needs("POST")) return;
    if (json_deeper_than(req.body)) {
      return reply_error(ex, ApiError::bad_request("The request body is nested too deeply (more than 128 levels of arrays and objects).", "invalid_json"),
                         route);
    }
    ojson body = ojson::parse(req.body, nullptr, false);
    if (body.is_discarded()) {
      return reply_error(ex, ApiError::bad_request("The request body is not valid JSON (or not valid UTF-8).", "invalid_json"), route);
    }
    if (!body.is_object()) return reply_error(ex, ApiError::bad_request("The request body must be a JSON object.", "invalid_body"), route);
    if (body.contains("model") && !body["model"].is_null()) {
      if (!body["model"].is_string()) return reply_error(ex, ApiError::bad_request("'model' must be a string.", "invalid_type", "model"), route);
      if (body["model"].get<std::string>() != opt_.served_model_name) {
        return reply_error(ex, ApiError::not_found("The model does not exist on this server."), route);
      }
    }
    if (route == "/tokenize") return tokenize(ex, body, route);
    if (route == "/detokenize") return detokenize(ex, body, route);
    return generate(ex, body, route == "/v1/chat/completions", route);
  }
  return reply_error(ex, ApiError::not_found("Unknown route."), route);
}

std::string OpenAiApp::metrics_text() const {
  const auto& kv = engine_->kv_config();
  return metrics_.render(engine_->stats(), opt_.served_model_name, engine_->options().scheduler.kv_watermark, kv.block_size,
                         std::string(backend::kv_dtype_name(kv.dtype)), engine_->memory_plan(),
                         opt_.gpu_memory ? opt_.gpu_memory() : std::vector<GpuMemorySample>{}) +
         "# HELP lmserve:generation_requests_in_flight Completion requests being served now.\n"
         "# TYPE lmserve:generation_requests_in_flight gauge\nlmserve:generation_requests_in_flight " +
         std::to_string(generations_.load()) +
         "\n# HELP lmserve:generation_requests_in_flight_peak The most completion requests served at once since start.\n"
         "# TYPE lmserve:generation_requests_in_flight_peak gauge\nlmserve:generation_requests_in_flight_peak " +
         std::to_string(generations_peak_.load()) + "\n";
}

void OpenAiApp::tokenize(http::Exchange& ex, const ojson& body, const std::string& route) {
  std::vector<std::int32_t> ids;
  if (body.contains("messages")) {
    auto p = parse_request(body, true);
    if (!p) return reply_error(ex, p.error(), route);
    auto prompt = render_chat(*p);
    if (!prompt) return reply_error(ex, prompt.error(), route);
    ids = std::move(*prompt);
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    bool add = true;
    if (body.contains("add_special_tokens")) {
      if (!body["add_special_tokens"].is_boolean()) {
        return reply_error(ex, ApiError::bad_request("'add_special_tokens' must be a boolean.", "invalid_type", "add_special_tokens"), route);
      }
      add = body["add_special_tokens"].get<bool>();
    }
    ids = tokenizer_->encode(body["prompt"].get<std::string>(), {.add_special_tokens = add});
  } else {
    return reply_error(ex, ApiError::bad_request("'prompt' must be a string (or send 'messages').", "invalid_type", "prompt"), route);
  }
  reply(ex, 200, ojson{{"count", ids.size()}, {"max_model_len", engine_->options().scheduler.max_model_len}, {"tokens", ids}}.dump(), route);
}

void OpenAiApp::detokenize(http::Exchange& ex, const ojson& body, const std::string& route) {
  if (!body.contains("tokens") || !body["tokens"].is_array()) {
    return reply_error(ex, ApiError::bad_request("'tokens' must be a list of token ids.", "invalid_type", "tokens"), route);
  }
  std::vector<std::int32_t> ids;
  const auto vocab = static_cast<std::int64_t>(tokenizer_->vocab_size());
  for (const auto& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() >= vocab) {
      return reply_error(ex, ApiError::bad_request("'tokens' holds an id outside the vocabulary.", "invalid_value", "tokens"), route);
    }
    ids.push_back(t.get<std::int32_t>());
  }
  reply(ex, 200, ojson{{"prompt", tokenizer_->decode(ids, false)}}.dump(-1, ' ', false, ojson::error_handler_t::replace), route);
}

Expected<std::vector<std::int32_t>, ApiError> OpenAiApp::render_chat(const ParsedRequest& p) const {
  if (!chat_template_) return Unexpected<ApiError>(ApiError::bad_request("This model has no chat template.", "no_chat_template"));
  auto rendered = chat_template_->render(p.chat_request);
  if (!rendered) {
    const std::string& m = rendered.error().message();
    const std::string prefix = "raise_exception: ";
    if (m.starts_with(prefix)) return Unexpected<ApiError>(ApiError::bad_request(m.substr(prefix.size()), "chat_template_error"));
    return Unexpected<ApiError>(ApiError::bad_request("The chat template could not render these messages.", "chat_template_error"));
  }
  auto segments = rendered->segments();
  return tokenizer_->encode_segments(segments, false);
}

// ---- Server -------------------------------------------------------------------------------------

// The transport's application: the OpenAI routes once attached, the start-up answers before.
struct Server::Impl : http::Application {
  ServerOptions options;
  std::unique_ptr<OpenAiApp> owned;      // set once by attach()
  std::atomic<OpenAiApp*> app{nullptr};  // published once it is complete
  http::Transport transport;             // last: stopped and destroyed first

  explicit Impl(ServerOptions o) : options(std::move(o)), transport(static_cast<const http::TransportOptions&>(options), *this) {}

  void attach(std::unique_ptr<engine::Engine> e, std::shared_ptr<const text::Tokenizer> t, std::optional<text::ChatTemplate> c,
              std::function<std::vector<GpuMemorySample>()> gpu_memory) {
    if (gpu_memory) options.gpu_memory = std::move(gpu_memory);
    owned = std::make_unique<OpenAiApp>(options, std::move(e), std::move(t), std::move(c));
    owned->set_transport(&transport);
    app.store(owned.get(), std::memory_order_release);
  }

  void handle(http::Exchange ex) override {
    if (auto* a = app.load(std::memory_order_acquire)) return a->handle(ex);
    const auto& req = ex.request();
    if (req.path == "/version" && req.method == "GET") {
      return ex.reply({.status = 200, .body = version_json()});
    }
    if (req.path == "/metrics" && req.method == "GET") {
      std::string out;
      render_startup_seconds(out, options.served_model_name);
      return ex.reply({.status = 200, .content_type = "text/plain; version=0.0.4", .body = std::move(out)});
    }
    const std::string phase = startup_current_phase();
    auto r = ApiError::unavailable("The server is starting" + (phase.empty() ? std::string() : " (" + phase + ")") + "; try again shortly.").response();
    r.headers.emplace_back("Retry-After", "5");
    ex.reply(std::move(r));
  }
  http::Response error_response(http::TransportError error) override {
    if (auto* a = app.load(std::memory_order_acquire)) return a->error_response(error);
    return ApiError::from_transport(error).response();
  }
  void drain(std::chrono::milliseconds grace) override {
    if (auto* a = app.load(std::memory_order_acquire)) a->drain(grace);
  }
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::Server(ServerOptions options, std::unique_ptr<engine::Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer,
               std::optional<text::ChatTemplate> chat_template)
    : Server(std::move(options)) {
  attach(std::move(engine), std::move(tokenizer), std::move(chat_template));
}

Server::~Server() = default;
void Server::attach(std::unique_ptr<engine::Engine> engine, std::shared_ptr<const text::Tokenizer> tokenizer,
                    std::optional<text::ChatTemplate> chat_template, std::function<std::vector<GpuMemorySample>()> gpu_memory) {
  impl_->attach(std::move(engine), std::move(tokenizer), std::move(chat_template), std::move(gpu_memory));
}
Status Server::start() { return impl_->transport.start(); }
int Server::port() const { return impl_->transport.port(); }
void Server::run(bool handle_signals) { impl_->transport.run(handle_signals); }
void Server::shutdown() { impl_->transport.shutdown(); }
bool Server::draining() const { return impl_->transport.draining(); }

}  // namespace lmserve::server
