#include "gateway/gateway.h"

#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <boost/asio/signal_set.hpp>
#include <nlohmann/json.hpp>
#include <functional>
#include <thread>

#include "common/json_depth.h"
#include "common/json_line.h"
#include "gateway/access_log.h"
#include "gateway/digest.h"
#include "gateway/redact.h"
#include "gateway/tokens.h"
#include "gateway/errors.h"
#include "gateway/guards.h"
#include "gateway/keys.h"
#include "gateway/monitor.h"
#include "server/dashboard.h"

#include <cstdlib>
#include <map>
#include "gateway/proxy.h"
#include "gateway/route_fields.h"
#include "server/http/asio.h"
#include "server/http/transport.h"

namespace lmserve::gateway {

namespace net = boost::asio;
namespace http = server::http;

namespace {

bool loopback(const std::string& address) { return address == "127.0.0.1" || address == "::1" || address.rfind("::ffff:127.", 0) == 0; }

// The prompt's text as the replica would see it first: the completion prompt, or the
// conversation's contents in order.
std::string prompt_text(const nlohmann::json& j) {
  std::string out;
  if (auto p = j.find("prompt"); p != j.end()) {
    if (p->is_string()) return p->get<std::string>();
    if (p->is_array() && !p->empty() && p->front().is_string()) return p->front().get<std::string>();
    return out;
  }
  if (auto m = j.find("messages"); m != j.end() && m->is_array()) {
    for (const auto& msg : *m) {
      if (!msg.is_object()) continue;
      if (auto r = msg.find("role"); r != msg.end() && r->is_string()) out += r->get<std::string>() + "\n";
      auto c = msg.find("content");
      if (c == msg.end()) continue;
      if (c->is_string()) out += c->get<std::string>() + "\n";
      if (c->is_array()) {
        for (const auto& part : *c) {
          if (part.is_object() && part.contains("text") && part["text"].is_string()) out += part["text"].get<std::string>();
        }
        out += "\n";
      }
    }
  }
  return out;
}


}  // namespace

// What a configuration needs built before it is used: the prompt counters of the models that
// name a tokenizer folder (those of `before`, the configuration in force, kept where the folder
// is the same), and the guards.
static Status prepare(Snapshot& snap, const Snapshot* before) {
  for (const auto& m : snap.config.models) {
    if (m.tokenizer.empty()) continue;
    if (before) {
      const auto* was = before->config.find_model(m.name);
      const auto it = before->counters.find(m.name);
      if (was && was->tokenizer == m.tokenizer && it != before->counters.end()) {
        snap.counters.emplace(m.name, it->second);
        continue;
      }
    }
    auto c = PromptCounter::load(m.tokenizer);
    if (!c) return Status(c.error().code(), "models." + m.name + ".tokenizer: " + c.error().message());
    snap.counters.emplace(m.name, std::move(*c));
  }
  auto guards = build_guards(snap.config);
  if (!guards) return guards.error();
  snap.guards = std::move(*guards);
  snap.needs_document = !snap.counters.empty() ||
                        std::any_of(snap.config.models.begin(), snap.config.models.end(), [](const ModelConfig& m) { return m.policy == Policy::kPrefixAware; }) ||
                        std::any_of(snap.config.tenants.begin(), snap.config.tenants.end(),
                                    [](const auto& t) { return t.second.audit_content == TenantConfig::AuditContent::kRedacted; });
  return Status::ok();
}

struct Gateway::Impl : http::Application {
  GatewayOptions options;
  // Declared after the transport, so destroyed before it: the state's sockets and timers (idle
  // connections, the deadline scanner) belong to the transport's io_context.
  std::unique_ptr<http::Transport> transport;
  std::unique_ptr<State> state;
  std::unique_ptr<Monitor> monitor;
  std::unique_ptr<server::Dashboard> dashboard;  // GET /dashboard: the replicas' figures, once a second
  std::unique_ptr<KeyIndex> keys;  // with keys_db: every API request needs one of them
  std::optional<net::steady_timer> keys_timer;
  std::optional<net::signal_set> hangup;
  std::mutex reload_mu;

  // ---- http::Application ----------------------------------------------------------------------
  void handle(http::Exchange ex) override {
    const auto& req = ex.request();
    const auto& path = req.path;
    auto snap = state->current();
    if (path == "/health" || path == "/ready") return own_route(ex, *snap);
    if (path == "/metrics" || path.starts_with("/admin/") || path == "/dashboard" || path.starts_with("/dashboard/")) {
      if (admin) return ex.reply(error_response(404, "no such route (the admin routes are on admin_listen)", "not_found"));
      return own_route(ex, *snap);
    }
    std::shared_ptr<const KeyRecord> key;  // with keys, once authenticated
    if (keys && path.starts_with("/v1/")) {  // OpenAI's API asks for the key on every route
      auto a = authenticate(req);
      if (a.refusal) return ex.reply(std::move(*a.refusal));
      key = std::move(a.key);
    }
    if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
      if (!readable(req)) return ex.reply(method_not_allowed("GET"));
      return models(ex, *snap);
    }
    if (req.method != "POST") return ex.reply(path.starts_with("/v1/") ? method_not_allowed("POST") : error_response(404, "no such route", "not_found"));
    // Refused by the gateway itself: answered, and logged as a proxied request would be.
    std::string tenant;  // with a valid key
    auto refuse = [&](http::Response r, const std::string& model, const std::string& code) { refuse_now(ex, *snap, tenant, std::move(r), model, code); };
    // A refusal of a request that reached admission: its record first (audit_then).
    auto refuse_audited = [&](JsonLine rec, http::Response r, const std::string& model, const std::string& code) {
      if (!state->audit) return refuse(std::move(r), model, code);
      rec.num("status", r.status);
      audit_then(std::move(rec), ex, [this, ex, snap, tenant, r = std::move(r), model, code](bool ok) mutable {
        if (!ok) return refuse_now(ex, *snap, tenant, audit_unavailable(), model, "audit_unavailable");
        refuse_now(ex, *snap, tenant, std::move(r), model, code);
      });
    };
    if (transport->draining()) {
      auto r = error_response(503, "the gateway is shutting down", "service_unavailable");
      r.headers.emplace_back("Retry-After", "1");
      return refuse(std::move(r), "", "shutting_down");
    }
    // The policies that read the body (the guard, the keys' token limits) take their fields from
    // the routing pass: the scanner's, or where the document is needed anyway, the document it
    // builds (one parse, not two).
    const bool policies = keys || snap->guards.defaults || !snap->guards.tenants.empty();
    std::optional<nlohmann::json> dom;
    if (snap->needs_document) dom.emplace();
    RouteFields fields(dom ? &*dom : nullptr);
    PolicyFieldValues policy;
    const bool parsed = dom ? nlohmann::json::sax_parse(req.body, &fields) : scan_route_fields(req.body, fields, policies ? &policy : nullptr);
    if (dom && parsed && !fields.refusal && policies) policy = policy_fields(*dom);
    if (fields.refusal) return refuse(error_response(400, fields.refusal, "invalid_request"), "", "invalid_json");
    if (!parsed || !fields.object) return refuse(error_response(400, "the request body must be a JSON object", "invalid_request"), "", "invalid_json");
    if (!fields.model) return refuse(error_response(400, "'model' is required", "invalid_request"), "", "no_model");
    const auto* model = snap->config.find_model(*fields.model);
    if (!model) return refuse(error_response(404, "the model does not exist", "model_not_found"), "", "model_not_found");
    if (keys && !key) {  // a route outside /v1/
      auto a = authenticate(req);
      if (a.refusal) return refuse(std::move(*a.refusal), model->name, "invalid_api_key");
      key = std::move(a.key);
    }
    if (key) {
      tenant = key->tenant;
      if (!key->may_use(model->name)) {
        auto r = error_response(403, "the API key may not use this model", "model_not_allowed");
        if (!state->audit) return refuse(std::move(r), model->name, "model_not_allowed");
        // A valid key: the request reached admission, and its refusal is audited.
        auto rec = audit_base("refused", state->next_id(), key->tenant, key->id, model->name, req);
        rec.str("error", "model_not_allowed");
        return refuse_audited(std::move(rec), std::move(r), model->name, "model_not_allowed");
      }
    }
    RouteInfo info;
    info.id = state->next_id();
    // The body as a document, parsed once when something needs more than the routing fields.
    auto body = [&]() -> const nlohmann::json& {
      if (!dom) dom = nlohmann::json::parse(req.body, nullptr, false);
      return *dom;
    };
    if (model->policy == Policy::kPrefixAware) info.prompt = prompt_text(body());
    info.lane = req.header("x-lmserve-lane");
    if (key) {
      info.key_id = key->id;
      info.tenant = key->tenant;
      info.drop_authorization = true;  // the gateway's key is not the replica's
      if (!key->lane.empty()) info.lane = key->lane;  // the key's lane, whatever the client asked
    }
    if (!model->canary.header.empty()) info.header_version = req.header(model->canary.header);
    if (model->canary.sticky == CanaryConfig::Sticky::kUser) info.sticky_key = fields.user;
    if (model->canary.sticky == CanaryConfig::Sticky::kHeader) info.sticky_key = req.header(model->canary.sticky_header);
    if (model->affinity.enabled) {
      if (!model->affinity.header.empty()) info.session_key = req.header(model->affinity.header);
      if (info.session_key.empty()) info.session_key = fields.user;
      if (info.session_key.empty()) info.session_key = req.remote_address;
    }
    if (const Guard* guard = snap->guard_for(info.tenant)) {
      auto rule = guard->check(policy.prompt_texts);  // the prompt's texts before the messages'
      if (!rule) rule = guard->check(policy.message_texts);
      if (rule) {
        if (!info.tenant.empty()) state->metrics.tenant_blocked(info.tenant, *rule);
        auto r = error_response(400, "the request was blocked by the content rule " + *rule, "content_blocked");
        auto rec = audit_base("refused", info.id, info.tenant, info.key_id, model->name, req);
        rec.str("error", "content_blocked").str("rule", *rule);
        return refuse_audited(std::move(rec), std::move(r), model->name, "content_blocked");
      }
    }
    if (key && has_limits(key->limits)) {
      auto refusal = admit(body, policy, *snap, *model, *key, info);
      if (refusal) {
        state->metrics.tenant_limited(key->tenant, refusal->second);
        auto rec = audit_base("refused", info.id, key->tenant, key->id, model->name, req);
        rec.str("error", refusal->second);
        return refuse_audited(std::move(rec), std::move(refusal->first), model->name, refusal->second);
      }
    }
    if (state->audit) {
      info.audit_text = snap->config.tenant(info.tenant).audit_content == TenantConfig::AuditContent::kRedacted;
      // A whole answer waits for its outcome's record (proxy.cpp), which then carries the prompt's
      // digest: one record a request. A stream's first bytes go out before its outcome is known,
      // so its admission is recorded before anything goes to a replica; so is every request's
      // while the trail fails, which turns it away before a replica spends anything on it.
      if (!fields.stream && !state->audit_failing.load(std::memory_order_relaxed)) {
        if (info.audit_text) info.audit_prompt = redact(prompt_text(body()));
        return start_proxy(*state, std::move(snap), *model, ex, std::move(info));
      }
      info.admission_audited = true;
      auto rec = audit_base("admitted", info.id, info.tenant, info.key_id, model->name, req);
      rec.str("lane", info.lane);
      if (info.audit_text) rec.str("prompt", redact(prompt_text(body())));
      // The I/O thread goes on with other requests while the record is written.
      return audit_then(std::move(rec), ex, [this, ex, snap = std::move(snap), model, tenant, info = std::move(info)](bool ok) mutable {
        if (!ok) {
          if (info.grant) info.grant->settle(0);  // nothing reached a replica
          return refuse_now(ex, *snap, tenant, audit_unavailable(), model->name, "audit_unavailable");
        }
        start_proxy(*state, std::move(snap), *model, ex, std::move(info));
      });
    }
    start_proxy(*state, std::move(snap), *model, ex, std::move(info));
  }

  // Answered by the gateway itself: counted, logged as a proxied request would be, and sent.
  void refuse_now(http::Exchange& ex, const Snapshot& snap, const std::string& tenant, http::Response r, const std::string& model, const std::string& code) {
    const auto& req = ex.request();
    if (!tenant.empty()) state->metrics.tenant_request(tenant, model, r.status);
    if (snap.config.access_log) {
      write_access_log({.id = state->next_id(), .model = model, .path = req.path, .client = req.remote_address, .error = code, .status = r.status});
    }
    ex.reply(std::move(r));
  }

  // ---- limits -----------------------------------------------------------------------------------
  static bool has_limits(const KeyLimits& l) { return l.rpm > 0 || l.tpm > 0 || l.max_concurrency > 0 || l.daily_tokens > 0 || l.max_input_tokens > 0; }

  // Counts the request against its key's limits: on admission its grant goes in `info`; else the
  // answer that refuses it and the limit's name.
  std::optional<std::pair<http::Response, std::string>> admit(const std::function<const nlohmann::json&()>& document, const PolicyFieldValues& fields,
                                                              const Snapshot& snap, const ModelConfig& model, const KeyRecord& key, RouteInfo& info) {
    const auto& l = key.limits;
    std::int64_t reserve = 0;
    if (l.tpm > 0 || l.daily_tokens > 0 || l.max_input_tokens > 0) {
      // The model's tokenizer where it has one, else the estimate.
      const auto c = snap.counters.find(model.name);
      const std::int64_t prompt = c != snap.counters.end() ? c->second->count(document()) : fields.estimated_prompt_tokens();
      if (l.max_input_tokens > 0 && prompt > l.max_input_tokens) {
        return std::pair{error_response(400,
                                        "the prompt has " + std::to_string(prompt) + " tokens, over this key's max_input_tokens of " +
                                            std::to_string(l.max_input_tokens),
                                        "input_too_long"),
                         std::string("max_input_tokens")};
      }
      reserve = prompt + fields.answer_limit().value_or(model.default_max_tokens);
    }
    const auto now = Limiter::Clock::now();
    auto a = state->limiter->admit(key.id, l, info.id, reserve, now);
    if (!a.admitted) {
      if (a.unavailable) {
        auto r = error_response(503, "the gateway's limits cannot be checked", "limits_unavailable");
        r.headers.emplace_back("Retry-After", "1");
        return std::pair{std::move(r), a.limit};
      }
      auto r = error_response(429, a.message, "rate_limit_exceeded");
      r.headers.emplace_back("Retry-After", std::to_string(a.retry_after_s));
      return std::pair{std::move(r), a.limit};
    }
    info.grant = std::make_shared<Grant>(*state->limiter, key.id, l, info.id, reserve, now);
    return std::nullopt;
  }

  static bool readable(const http::Request& req) { return req.method == "GET" || req.method == "HEAD"; }
  static http::Response method_not_allowed(const char* allow) {
    auto r = error_response(405, std::string("this route takes ") + allow, "method_not_allowed");
    r.headers.emplace_back("Allow", allow == std::string_view("GET") ? "GET, HEAD" : allow);
    return r;
  }

  // The gateway's own routes: /health, /ready, /metrics, /admin/reload (on admin_listen when set).
  void own_route(http::Exchange& ex, const Snapshot& snap) {
    const auto& req = ex.request();
    const auto& path = req.path;
    if (path != "/admin/reload" && !readable(req)) {
      const bool known = path == "/health" || path == "/ready" || path == "/metrics" || path == "/dashboard" || path.starts_with("/dashboard/");
      return ex.reply(known ? method_not_allowed("GET") : error_response(404, "no such route", "not_found"));
    }
    if (path == "/health") return ex.reply({.status = 200, .content_type = "text/plain", .body = "ok\n"});
    if (path == "/ready") return ready(ex, snap);
    if (path == "/metrics") return ex.reply({.status = 200, .content_type = "text/plain; version=0.0.4", .body = render_metrics(snap)});
    if (path == "/dashboard") return ex.reply({.status = 200, .content_type = "text/html; charset=utf-8", .body = std::string(server::Dashboard::gateway_page())});
    if (path == "/dashboard/chart.js") {
      return ex.reply({.status = 200, .content_type = "text/javascript; charset=utf-8", .body = std::string(server::Dashboard::chart_js())});
    }
    if (path == "/dashboard/data" && dashboard) {
      std::int64_t since = 0;  // ?since=MS: the samples after it
      if (const auto q = req.target.find("since="); q != std::string::npos) since = std::strtoll(req.target.c_str() + q + 6, nullptr, 10);
      return ex.reply({.status = 200, .body = dashboard->data_json(since)});
    }
    if (path == "/admin/reload") {
      if (req.method != "POST") return ex.reply(method_not_allowed("POST"));
      // On the API's address only from this host; admin_listen is the operator's to protect.
      if (!admin && !loopback(req.remote_address)) return ex.reply(error_response(403, "the admin routes answer only on the loopback interface", "forbidden"));
      auto st = reload_config();
      if (!st.is_ok()) return ex.reply(error_response(400, st.message(), "invalid_config"));
      return ex.reply({.status = 200, .body = R"({"status":"reloaded"})"});
    }
    ex.reply(error_response(404, "no such route", "not_found"));
  }

  // admin_listen's application: the own routes, nothing else.
  struct AdminApp : http::Application {
    explicit AdminApp(Impl& i) : impl(i) {}
    void handle(http::Exchange ex) override { impl.own_route(ex, *impl.state->current()); }
    http::Response error_response(http::TransportError e) override { return impl.error_response(e); }
    void drain(std::chrono::milliseconds) override {}
    Impl& impl;
  };
  std::unique_ptr<AdminApp> admin_app;
  std::unique_ptr<http::Transport> admin;  // with admin_listen
  std::thread admin_thread;

  // ---- the audit trail --------------------------------------------------------------------------
  // A record's common fields. The prompt's digest is the SHA-256 of the request body as received.
  JsonLine audit_base(const char* event, std::uint64_t id, const std::string& tenant, const std::string& key_id, const std::string& model,
                      const http::Request& req) {
    JsonLine rec;
    rec.str("event", event).num("id", static_cast<std::int64_t>(id)).str("time", utc_now()).str("tenant", tenant).str("key_id", key_id);
    rec.str("model", model).str("path", req.path).str("prompt_sha256", sha256_hex(req.body));
    return rec;
  }

  // Queues `rec` on the audit trail; `then(ok)` runs on the exchange's thread once it is written,
  // ok false when it could not be and the trail is fail-closed. The thread serves others meanwhile.
  void audit_then(JsonLine rec, const http::Exchange& ex, std::function<void(bool)> then) {
    state->audit_then(server::http::io_context_of(ex), std::move(rec).done(), std::move(then));
  }

  static http::Response audit_unavailable() {
    auto r = error_response(503, "the audit trail cannot be written", "audit_unavailable");
    r.headers.emplace_back("Retry-After", "1");
    return r;
  }

  http::Response error_response(http::TransportError e) override {
    switch (e) {
      case http::TransportError::kRequestTimeout: return error_response(408, "the request was not received in time", "request_timeout");
      case http::TransportError::kHeadersTooLarge: return error_response(431, "the request headers are too large", "invalid_request");
      case http::TransportError::kBodyTooLarge: return error_response(413, "the request body is too large", "invalid_request");
      case http::TransportError::kMalformed: return error_response(400, "the request is not valid HTTP", "invalid_request");
      case http::TransportError::kTooManyConnections: {
        auto r = error_response(503, "too many connections", "service_unavailable");
        r.headers.emplace_back("Retry-After", "1");
        return r;
      }
      case http::TransportError::kInternal: break;
    }
    return error_response(500, "internal error", "internal_error");
  }
  // The namespace's, which the override above would hide.
  static http::Response error_response(int status, const std::string& message, const std::string& code) {
    return gateway::error_response(status, message, code);
  }

  void drain(std::chrono::milliseconds grace) override {
    const auto until = std::chrono::steady_clock::now() + grace;
    while (state->in_flight.sum() > 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    monitor->stop();
    state->deadlines.stop();
    if (keys_timer) net::post(state->ioc, [this] { keys_timer->cancel(); });
  }

  // The key table is read again every 500 ms when it changed: a revoked key stops within that.
  void refresh_keys() {
    keys_timer->expires_after(std::chrono::milliseconds(500));
    keys_timer->async_wait([this](const boost::system::error_code& ec) {
      if (ec || transport->draining()) return;
      if (auto st = keys->refresh(); !st.is_ok()) spdlog::error("gateway: {} (keeping the keys read before)", st.message());
      refresh_keys();
    });
  }

  // The request's key, or the answer that refuses the request (no key, an unknown, revoked or
  // expired one). Whether the key may use the model asked for is the caller's to check.
  struct Auth {
    std::shared_ptr<const KeyRecord> key;
    std::optional<http::Response> refusal;
  };
  Auth authenticate(const http::Request& req) {
    if (!keys) return {};
    auto auth = req.header("authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (auth.size() <= kBearer.size() || strncasecmp(auth.data(), kBearer.data(), kBearer.size()) != 0) {
      return {.refusal = error_response(401, "an API key is required: Authorization: Bearer sk-lms-...", "invalid_api_key")};
    }
    auto k = keys->find(auth.substr(kBearer.size()));
    if (!k) return {.refusal = error_response(401, "the API key is not valid", "invalid_api_key")};
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    if (k->revoked_at != 0) return {.refusal = error_response(401, "the API key has been revoked", "invalid_api_key")};
    if (!k->valid_at(now)) return {.refusal = error_response(401, "the API key has expired", "invalid_api_key")};
    return {.key = std::move(k)};
  }

  // ---- routes -------------------------------------------------------------------------------
  void ready(http::Exchange& ex, const Snapshot& snap) {
    nlohmann::json out = nlohmann::json::object();
    bool ok = !transport->draining();
    const auto now = Clock::now();
    for (const auto& m : snap.config.models) {
      int n = 0;
      for (const auto& b : m.backends) {
        for (const auto& r : state->replicas.of(b)) n += r->available(now) ? 1 : 0;
      }
      out[m.name] = n;
      ok = ok && n > 0;
    }
    nlohmann::json body = {{"ready", ok}, {"available_replicas", out}};
    ex.reply({.status = ok ? 200 : 503, .body = body.dump()});
  }

  void models(http::Exchange& ex, const Snapshot& snap) {
    auto card = [](const ModelConfig& m) { return nlohmann::json{{"id", m.name}, {"object", "model"}, {"created", 0}, {"owned_by", "lmserve"}}; };
    const auto& path = ex.request().path;
    if (path == "/v1/models") {
      nlohmann::json data = nlohmann::json::array();
      for (const auto& m : snap.config.models) data.push_back(card(m));
      return ex.reply({.status = 200, .body = nlohmann::json{{"object", "list"}, {"data", data}}.dump()});
    }
    const auto* m = snap.config.find_model(path.substr(std::string("/v1/models/").size()));
    if (!m) return ex.reply(error_response(404, "the model does not exist", "model_not_found"));
    ex.reply({.status = 200, .body = card(*m).dump()});
  }

  std::string render_metrics(const Snapshot& snap) {
    std::vector<GatewayMetrics::ReplicaRow> rows;
    const auto now = Clock::now();
    for (const auto& m : snap.config.models) {
      for (const auto& b : m.backends) {
        for (const auto& r : state->replicas.of(b)) rows.push_back({m.name, r->url(), b.version, r->healthy(), r->available(now), r->outstanding.sum()});
      }
    }
    return state->metrics.render(rows);
  }

  // ---- configuration ------------------------------------------------------------------------
  Status reload_config() {
    std::lock_guard lock(reload_mu);
    auto c = load_config(options.config_path);
    if (!c) {
      spdlog::error("gateway: reload refused, keeping the configuration in force: {}", c.error().message());
      return c.error();
    }
    const auto old_snap = state->current();
    const auto& old = old_snap->config;
    if (c->listen_host != old.listen_host || (options.port_override < 0 && c->listen_port != old.listen_port) || c->io_threads != old.io_threads ||
        c->max_connections != old.max_connections || c->keys_db != old.keys_db || c->key_secret_file != old.key_secret_file ||
        c->audit.dir != old.audit.dir || c->audit.fail_closed != old.audit.fail_closed || c->audit.segment_bytes != old.audit.segment_bytes ||
        c->audit.sync != old.audit.sync || c->redis_host != old.redis_host || c->redis_port != old.redis_port || c->admin_host != old.admin_host ||
        (options.port_override < 0 && c->admin_port != old.admin_port)) {
      spdlog::warn("gateway: listen, admin_listen, io_threads, max_connections, keys_db, key_secret_file, audit and redis take effect at the next start");
    }
    c->audit = old.audit;  // the trail in force is the one the snapshot describes
    c->listen_host = old.listen_host;
    c->listen_port = old.listen_port;
    c->admin_host = old.admin_host;
    c->admin_port = old.admin_port;
    auto next = std::make_shared<Snapshot>(std::move(*c));
    if (auto st = prepare(*next, old_snap.get()); !st.is_ok()) {
      spdlog::error("gateway: reload refused, keeping the configuration in force: {}", st.message());
      return st;
    }
    Monitor::resolve_now(*state, next->config);
    state->set(std::move(next));
    spdlog::info("gateway: configuration reloaded from {}", options.config_path);
    return Status::ok();
  }

  void watch_hangup() {
    hangup->async_wait([this](const boost::system::error_code& ec, int) {
      if (ec) return;
      (void)reload_config();
      watch_hangup();
    });
  }
};

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gateway::~Gateway() {
  if (impl_ && impl_->admin_thread.joinable()) {  // started, never run
    impl_->admin->shutdown();
    impl_->admin_thread.join();
  }
}

Result<std::unique_ptr<Gateway>> Gateway::create(GatewayOptions options) {
  auto c = load_config(options.config_path);
  if (!c) return error(c.error());
  if (options.port_override >= 0) c->listen_port = options.port_override;
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  http::TransportOptions t;
  t.host = c->listen_host;
  t.port = c->listen_port;
  t.io_threads = c->io_threads;
  t.max_connections = c->max_connections;
  t.server_header = "lmserve-gateway";
  impl->transport = std::make_unique<http::Transport>(t, *impl);
  if (c->admin_port >= 0) {
    http::TransportOptions at;
    at.host = c->admin_host;
    at.port = c->admin_port;
    at.io_threads = 1;
    at.server_header = "lmserve-gateway";
    impl->admin_app = std::make_unique<Impl::AdminApp>(*impl);
    impl->admin = std::make_unique<http::Transport>(at, *impl->admin_app);
  }
  impl->state = std::make_unique<State>(http::context_of(*impl->transport));
  auto first = std::make_shared<Snapshot>(std::move(*c));
  if (auto st = prepare(*first, nullptr); !st.is_ok()) return error(st);
  impl->state->set(std::move(first));
  impl->monitor = std::make_unique<Monitor>(*impl->state);
  const auto& cfg = impl->state->current()->config;
  if (!cfg.audit.dir.empty()) {
    auto audit = AuditLog::open(cfg.audit.dir, {.segment_bytes = cfg.audit.segment_bytes, .sync = cfg.audit.sync});
    if (!audit) return error(audit.error());
    impl->state->audit = std::move(*audit);
    impl->state->audit_fail_closed = cfg.audit.fail_closed;
  }
  if (!cfg.redis_host.empty()) {
    auto limiter = make_redis_limiter(cfg.redis_host, cfg.redis_port, cfg.timeouts.total);
    if (!limiter) return error(limiter.error());
    impl->state->limiter = std::move(*limiter);
  }
  if (!cfg.keys_db.empty()) {
    auto keys = KeyIndex::open(cfg.keys_db, cfg.key_secret_file);
    if (!keys) return error(keys.error());
    impl->keys = std::move(*keys);
    impl->keys_timer.emplace(impl->state->ioc);
  }
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

Status Gateway::start() {
  Monitor::resolve_now(*impl_->state, impl_->state->current()->config);
  LMSERVE_RETURN_IF_ERROR(impl_->transport->start());
  if (impl_->admin) {
    LMSERVE_RETURN_IF_ERROR(impl_->admin->start());
    impl_->admin_thread = std::thread([a = impl_->admin.get()] { a->run(false); });
  }
  impl_->monitor->start();
  // The dashboard's samples: each replica of the configuration in force, its health and load
  // as this gateway sees them, and its own /metrics figures as last scraped.
  impl_->dashboard = std::make_unique<server::Dashboard>(
      [state = impl_->state.get(), samplers = std::make_shared<std::map<std::string, server::MetricsSampler>>()](std::int64_t t) {
        auto snap = state->current();
        std::string out = "{\"t\":" + std::to_string(t) + ",\"replicas\":[";
        bool first = true;
        for (const auto& m : snap->config.models) {
          for (const auto& b : m.backends) {
            for (const auto& r : state->replicas.of(b)) {
              const std::string text = r->metrics_text();
              nlohmann::json head{{"url", r->url()}, {"model", m.name}, {"version", b.version}, {"healthy", r->healthy()},
                                  {"outstanding", r->outstanding.sum()}};
              std::string one = head.dump();
              one.pop_back();  // the replica's own figures go in beside
              one += ",\"figures\":" + (text.empty() ? std::string("null") : (*samplers)[r->url()].sample(text, t, 0.95)) + "}";
              out += (first ? "" : ",") + one;
              first = false;
            }
          }
        }
        return out + "]}";
      });
  if (impl_->keys) net::post(impl_->state->ioc, [impl = impl_.get()] { impl->refresh_keys(); });
  return Status::ok();
}

int Gateway::port() const { return impl_->transport->port(); }
int Gateway::admin_port() const { return impl_->admin ? impl_->admin->port() : -1; }

void Gateway::run(bool handle_signals) {
  if (handle_signals) {
    impl_->hangup.emplace(impl_->state->ioc, SIGHUP);
    impl_->watch_hangup();
  }
  impl_->transport->run(handle_signals);
  impl_->hangup.reset();
  if (impl_->admin) {  // the API has drained: the admin address goes too
    impl_->admin->shutdown();
    if (impl_->admin_thread.joinable()) impl_->admin_thread.join();
  }
}

void Gateway::shutdown() { impl_->transport->shutdown(); }
Status Gateway::reload() { return impl_->reload_config(); }

}  // namespace lmserve::gateway
