// lmserve gateway --config FILE: the entry point in front of `serve` replicas (src/gateway/);
// lmserve gateway keys add|list|revoke|rotate: its API keys (gateway/keys.h);
// lmserve gateway audit verify DIR; lmserve gateway guard check: a text against the guard.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "gateway/audit.h"
#include "gateway/gateway.h"
#include "gateway/guards.h"
#include "gateway/injection_model.h"
#include "gateway/keys.h"

namespace lmserve::cli {

namespace {

std::int64_t unix_now() { return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string date_of(std::int64_t t) {
  if (t == 0) return "-";
  const std::time_t tt = t;
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Each text's verdict under the configuration's guard: exit 0 when all pass, 1 when one is
// blocked, 2 when the configuration does not load.
int run_guard_check(const std::string& config, const std::string& tenant, std::vector<std::string> texts) {
  if (config.empty()) {
    std::fprintf(stderr, "lmserve gateway guard check: --config is required\n");
    return 2;
  }
  auto c = gateway::load_config(config);
  auto guards = c ? gateway::build_guards(*c) : Result<gateway::Guards>(error(c.error()));
  if (!guards) {
    std::fprintf(stderr, "lmserve gateway guard check: %s\n", guards.error().message().c_str());
    return 2;
  }
  const gateway::Guard* g = guards->for_tenant(tenant);
  if (texts.empty()) {
    for (std::string line; std::getline(std::cin, line);) texts.push_back(line);
  }
  int rc = 0;
  for (const auto& t : texts) {
    const auto hit = g ? g->check(std::vector<std::string>{t}) : std::nullopt;
    std::string model = "no model";
    if (const auto* m = g ? g->injection_model() : nullptr) {
      const auto forms = gateway::guard_normalise(t);
      char buf[96];
      const bool anchored = m->anchored(forms);
      const char* note = anchored ? "" : forms.folded.size() <= gateway::kInjectionUnanchoredMaxBytes ? " (no anchor)" : " (no anchor, too long: not scored)";
      std::snprintf(buf, sizeof buf, "model %.3f of %g%s", m->probability(forms), anchored ? g->injection_threshold() : g->injection_threshold_unanchored(), note);
      model = buf;
    }
    std::printf("%s\t%s\t%s\t%s\n", hit ? "blocked" : "passes", hit ? hit->c_str() : "-", model.c_str(), t.c_str());
    if (hit) rc = 1;
  }
  return rc;
}

struct KeyOpts {
  std::string db, secret_file, tenant, models, lane, expires, target;
  gateway::KeyLimits limits;
  std::int64_t grace_s = 86400;
};

// `keys` and its four commands; the one that ran is in `which`.
void add_keys_commands(CLI::App& gw, std::shared_ptr<KeyOpts> k, std::shared_ptr<std::string> which) {
  auto* keys = gw.add_subcommand("keys", "API keys: add, list, revoke, rotate (stored as HMAC-SHA-256, never in clear)");
  keys->require_subcommand(1);
  auto common = [&](CLI::App* c) {
    c->add_option("--db", k->db, "the keys database (SQLite; the gateway config's keys_db)")->required();
    c->add_option("--key-secret-file", k->secret_file, "the server secret, at least 32 bytes (the config's key_secret_file)")->required();
    c->callback([which, name = c->get_name()] { *which = name; });
  };
  auto* add = keys->add_subcommand("add", "make a key for a tenant and print it (once: it is stored nowhere)");
  common(add);
  add->add_option("--tenant", k->tenant, "the system the key belongs to")->required();
  add->add_option("--models", k->models, "models it may use, comma-separated (default: all)");
  add->add_option("--lane", k->lane, "the lane its requests go to (overrides the client's x-lmserve-lane)")->check(CLI::IsMember({"high", "low"}));
  add->add_option("--rpm", k->limits.rpm, "requests per minute (0: no limit)");
  add->add_option("--tpm", k->limits.tpm, "tokens per minute (0: no limit)");
  add->add_option("--max-concurrency", k->limits.max_concurrency, "requests at once (0: no limit)");
  add->add_option("--daily-tokens", k->limits.daily_tokens, "tokens per day (0: no limit)");
  add->add_option("--max-input-tokens", k->limits.max_input_tokens, "prompt tokens per request (0: no limit)");
  add->add_option("--expires", k->expires, "YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ (UTC)");
  common(keys->add_subcommand("list", "the keys, masked, with their tenants, limits and state"));
  auto* revoke = keys->add_subcommand("revoke", "revoke a key at once (given as the key or its id)");
  common(revoke);
  revoke->add_option("key", k->target, "the key or its id (key_...)")->required();
  auto* rotate = keys->add_subcommand("rotate", "a new key with the same settings; the old one stays valid for --grace-seconds");
  common(rotate);
  rotate->add_option("key", k->target, "the key or its id (key_...)")->required();
  rotate->add_option("--grace-seconds", k->grace_s, "how long the old key keeps working (default a day)");
}

void print_key(const gateway::KeyRecord& r, std::int64_t now) {
  std::string models;
  for (const auto& m : r.models) models += (models.empty() ? "" : ",") + m;
  const auto& l = r.limits;
  const char* state = r.revoked_at ? "revoked" : (r.expires_at && now >= r.expires_at) ? "expired" : "active";
  std::printf("%s  %-12s %s  models=%s lane=%s rpm=%lld tpm=%lld concurrency=%lld daily=%lld input=%lld created=%s expires=%s %s%s%s\n", r.id.c_str(),
              r.tenant.c_str(), r.masked.c_str(), models.empty() ? "*" : models.c_str(), r.lane.empty() ? "-" : r.lane.c_str(), (long long)l.rpm,
              (long long)l.tpm, (long long)l.max_concurrency, (long long)l.daily_tokens, (long long)l.max_input_tokens, date_of(r.created_at).c_str(),
              date_of(r.expires_at).c_str(), state, r.replaced_by.empty() ? "" : " replaced_by=", r.replaced_by.c_str());
}

int run_keys(const KeyOpts& k, const std::string& which) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "lmserve gateway keys: %s\n", st.message().c_str());
    return 2;
  };
  auto secret = gateway::read_key_secret(k.secret_file);
  if (!secret) return fail(secret.error());
  auto store = gateway::KeyStore::open(k.db, *secret);
  if (!store) return fail(store.error());
  const auto now = unix_now();
  if (which == "add") {
    gateway::NewKey spec{.tenant = k.tenant, .lane = k.lane, .limits = k.limits};
    std::stringstream in(k.models);
    for (std::string m; std::getline(in, m, ',');) {
      if (!m.empty()) spec.models.push_back(m);
    }
    if (!k.expires.empty()) {
      auto t = gateway::parse_expiry(k.expires);
      if (!t) return fail(t.error());
      if (*t <= now) return fail(Status(StatusCode::kInvalidArgument, "--expires is in the past"));
      spec.expires_at = *t;
    }
    auto made = (*store)->add(spec, now);
    if (!made) return fail(made.error());
    std::printf("%s\n", made->first.c_str());
    std::fprintf(stderr, "made %s for tenant %s; the key above is shown once and stored nowhere\n", made->second.id.c_str(), made->second.tenant.c_str());
    return 0;
  }
  if (which == "list") {
    for (const auto& r : (*store)->list()) print_key(r, now);
    return 0;
  }
  if (which == "revoke") {
    auto r = (*store)->revoke(k.target, now);
    if (!r) return fail(r.error());
    std::printf("revoked %s (%s)\n", r->id.c_str(), r->masked.c_str());
    return 0;
  }
  auto made = (*store)->rotate(k.target, std::chrono::seconds(k.grace_s), now);
  if (!made) return fail(made.error());
  std::printf("%s\n", made->first.c_str());
  std::fprintf(stderr, "made %s; the old key works for %lld s more\n", made->second.id.c_str(), (long long)k.grace_s);
  return 0;
}

}  // namespace

Command add_gateway_command(CLI::App& app) {
  struct Opts {
    std::string config;
    int port = -1;
    bool check = false;
  };
  auto o = std::make_shared<Opts>();
  auto k = std::make_shared<KeyOpts>();
  auto which = std::make_shared<std::string>();
  app.add_option("--config", o->config, "the gateway's YAML file (models, backends, policies, timeouts, health)");
  add_keys_commands(app, k, which);
  auto audit_dir = std::make_shared<std::string>();
  auto* audit = app.add_subcommand("audit", "the audit trail: verify");
  audit->require_subcommand(1);
  auto* verify = audit->add_subcommand("verify", "check a directory's hash chain; name the first record that breaks it");
  verify->add_option("dir", *audit_dir, "the audit directory (the config's audit.dir)")->required();
  verify->callback([which] { *which = "audit verify"; });
  auto guard_tenant = std::make_shared<std::string>();
  auto guard_texts = std::make_shared<std::vector<std::string>>();
  auto* guard = app.add_subcommand("guard", "the content guard: check texts as the configuration's guard would");
  guard->require_subcommand(1);
  auto* check = guard->add_subcommand("check", "say of each text whether it passes, the rule that blocks it, and the injection model's probability");
  check->add_option("--tenant", *guard_tenant, "check as this tenant's requests are (its rules with the defaults)");
  check->add_option("--config", o->config, "the gateway's YAML file (as before `guard`)");
  // The texts are the arguments left over, each taken as it stands: a positional option would have
  // CLI11 read a text in brackets ("[SYSTEM] ... [END]") as a list and drop the brackets, and the
  // parent commands would take extras through fallthrough. So this command keeps its own extras
  // (the program's own options go before `gateway`).
  check->fallthrough(false);
  check->allow_extras();
  check->footer("TEXT ...: the texts, each argument one; with none, one a line from standard input.");
  check->callback([which, check, guard_texts] {
    *which = "guard check";
    *guard_texts = check->remaining();
  });
  app.add_option("--port", o->port, "listen on this port instead of the file's `listen` port (0: any free port)");
  app.add_flag("--check", o->check, "validate the configuration, print it back in brief, and exit");
  return [o, k, which, audit_dir, guard_tenant, guard_texts]() {
    if (*which == "guard check") return run_guard_check(o->config, *guard_tenant, *guard_texts);
    if (*which == "audit verify") {
      const auto v = gateway::verify_audit(*audit_dir);
      if (!v.ok) {
        std::printf("broken: %s (%llu records verified before it)\n", v.broken.c_str(), static_cast<unsigned long long>(v.records));
        return 1;
      }
      std::printf("ok: %llu record%s in %llu segment%s\n", static_cast<unsigned long long>(v.records), v.records == 1 ? "" : "s",
                  static_cast<unsigned long long>(v.segments), v.segments == 1 ? "" : "s");
      return 0;
    }
    if (!which->empty()) return run_keys(*k, *which);
    if (o->config.empty()) {
      std::fprintf(stderr, "lmserve gateway: --config is required\n");
      return 2;
    }
    if (o->check) {
      auto c = gateway::load_config(o->config);
      if (!c) {
        std::fprintf(stderr, "lmserve gateway: %s\n", c.error().message().c_str());
        return 2;
      }
      std::printf("listen %s:%d\n", c->listen_host.c_str(), c->listen_port);
      for (const auto& m : c->models) {
        std::printf("model %s: %s, %zu backend(s)\n", m.name.c_str(), gateway::policy_name(m.policy), m.backends.size());
      }
      return 0;
    }
    auto g = gateway::Gateway::create({.config_path = o->config, .port_override = o->port});
    if (!g) {
      std::fprintf(stderr, "lmserve gateway: %s\n", g.error().message().c_str());
      return 2;
    }
    if (auto st = (*g)->start(); !st.is_ok()) {
      std::fprintf(stderr, "lmserve gateway: %s\n", st.message().c_str());
      return 1;
    }
    spdlog::info("gateway: listening on port {}", (*g)->port());
    (*g)->run();
    spdlog::info("gateway: stopped");
    return 0;
  };
}

}  // namespace lmserve::cli
