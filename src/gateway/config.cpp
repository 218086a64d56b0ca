#include "gateway/config.h"

#include <yaml-cpp/yaml.h>

#include <boost/asio/ip/address.hpp>
#include <charconv>
#include <set>
#include <tuple>

#include "common/file.h"

namespace lmserve::gateway {

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::kRoundRobin: return "round_robin";
    case Policy::kLeastOutstanding: return "least_outstanding";
    case Policy::kKvAware: return "kv_aware";
    case Policy::kPrefixAware: return "prefix_aware";
  }
  return "?";
}

const ModelConfig* GatewayConfig::find_model(const std::string& name) const {
  for (const auto& m : models) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

const TenantConfig& GatewayConfig::tenant(std::string_view name) const {
  static const TenantConfig kDefault;
  auto it = tenants.find(name);
  return it == tenants.end() ? kDefault : it->second;
}

namespace {

// Errors carry the key's path; thrown inside this file only and turned into a Status below.
struct ConfigError {
  std::string message;
};

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw ConfigError{path + ": " + what}; }

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

// A mapping whose keys must all be among `allowed`.
void check_keys(const YAML::Node& n, const std::string& path, std::initializer_list<const char*> allowed) {
  if (!n.IsMap()) fail(path.empty() ? "config" : path, "must be a mapping");
  for (const auto& kv : n) {
    const auto key = kv.first.as<std::string>();
    bool ok = false;
    for (const char* a : allowed) ok = ok || key == a;
    if (!ok) fail(join(path, key), "unknown key");
  }
}

std::string get_string(const YAML::Node& n, const std::string& path) {
  if (!n.IsScalar()) fail(path, "must be a string");
  auto s = n.as<std::string>();
  if (s.empty()) fail(path, "must not be empty");
  return s;
}

std::int64_t get_int(const YAML::Node& n, const std::string& path, std::int64_t lo, std::int64_t hi) {
  if (!n.IsScalar()) fail(path, "must be an integer");
  const auto s = n.as<std::string>();
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) fail(path, "must be an integer, not '" + s + "'");
  if (v < lo || v > hi) fail(path, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return v;
}

bool get_bool(const YAML::Node& n, const std::string& path) {
  if (!n.IsScalar()) fail(path, "must be true or false");
  const auto s = n.as<std::string>();
  if (s == "true") return true;
  if (s == "false") return false;
  fail(path, "must be true or false, not '" + s + "'");
}

std::chrono::milliseconds get_ms(const YAML::Node& n, const std::string& path, std::int64_t lo = 1) {
  return std::chrono::milliseconds(get_int(n, path, lo, 24LL * 3600 * 1000));
}

// "host:port" with host an IP address.
// "HOST:PORT" (an IP address, IPv6 in brackets) of the key `key`.
std::pair<std::string, int> parse_listen(const std::string& s, const std::string& key) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) fail(key, "must be HOST:PORT");
  std::string host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  boost::system::error_code ec;
  boost::asio::ip::make_address(host, ec);
  if (ec) fail(key, "'" + host + "' is not an IP address");
  return {host, static_cast<int>(get_int(YAML::Node(s.substr(colon + 1)), key, 0, 65535))};
}

// "http://host[:port][/]": the replicas speak plain HTTP inside the cluster.
void parse_url(const std::string& url, BackendConfig& b, const std::string& path) {
  constexpr std::string_view kScheme = "http://";
  if (url.rfind(kScheme, 0) != 0) fail(path, "must start with http:// (got '" + url + "')");
  std::string rest = url.substr(kScheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) fail(path, "must be http://HOST[:PORT] without a path");
  std::string host = rest, port;
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string::npos) fail(path, "has an unclosed '['");
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') fail(path, "must be http://HOST[:PORT]");
      port = rest.substr(close + 2);
    }
  } else if (const auto colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) fail(path, "has no host");
  for (char ch : host) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == ':' || ch == '_')) {
      fail(path, "has an invalid host '" + host + "'");
    }
  }
  b.host = host;
  b.port = port.empty() ? 80 : static_cast<std::uint16_t>(get_int(YAML::Node(port), path + " (port)", 1, 65535));
  b.url = "http://" + rest;
}

Policy parse_policy(const std::string& s, const std::string& path) {
  if (s == "round_robin") return Policy::kRoundRobin;
  if (s == "least_outstanding") return Policy::kLeastOutstanding;
  if (s == "kv_aware") return Policy::kKvAware;
  if (s == "prefix_aware") return Policy::kPrefixAware;
  fail(path, "must be round_robin, least_outstanding, kv_aware or prefix_aware (got '" + s + "')");
}

ModelConfig parse_model(const YAML::Node& n, const std::string& path) {
  check_keys(n, path, {"name", "policy", "affinity", "backends", "canary", "tokenizer", "default_max_tokens"});
  ModelConfig m;
  if (!n["name"]) fail(join(path, "name"), "is required");
  m.name = get_string(n["name"], join(path, "name"));
  if (n["tokenizer"]) m.tokenizer = get_string(n["tokenizer"], join(path, "tokenizer"));
  if (n["default_max_tokens"]) m.default_max_tokens = get_int(n["default_max_tokens"], join(path, "default_max_tokens"), 1, 1 << 24);
  if (n["policy"]) m.policy = parse_policy(get_string(n["policy"], join(path, "policy")), join(path, "policy"));
  if (const auto a = n["affinity"]) {
    const auto p = join(path, "affinity");
    check_keys(a, p, {"header"});
    m.affinity.enabled = true;
    if (a["header"]) m.affinity.header = get_string(a["header"], join(p, "header"));
  }
  if (const auto c = n["canary"]) {
    const auto p = join(path, "canary");
    check_keys(c, p, {"header", "sticky"});
    if (c["header"]) m.canary.header = get_string(c["header"], join(p, "header"));
    if (const auto s = c["sticky"]) {
      if (s.IsMap()) {
        check_keys(s, join(p, "sticky"), {"header"});
        if (!s["header"]) fail(join(p, "sticky.header"), "is required");
        m.canary.sticky = CanaryConfig::Sticky::kHeader;
        m.canary.sticky_header = get_string(s["header"], join(p, "sticky.header"));
      } else {
        const auto v = get_string(s, join(p, "sticky"));
        if (v == "user") m.canary.sticky = CanaryConfig::Sticky::kUser;
        else if (v == "none") m.canary.sticky = CanaryConfig::Sticky::kNone;
        else fail(join(p, "sticky"), "must be user, none or {header: NAME} (got '" + v + "')");
      }
    }
  }
  const auto bs = n["backends"];
  if (!bs) fail(join(path, "backends"), "is required");
  if (!bs.IsSequence() || bs.size() == 0) fail(join(path, "backends"), "must be a non-empty list");
  std::set<std::string> urls;
  std::uint64_t total_weight = 0;
  for (std::size_t i = 0; i < bs.size(); ++i) {
    const auto p = join(path, "backends[" + std::to_string(i) + "]");
    check_keys(bs[i], p, {"url", "version", "weight"});
    BackendConfig b;
    if (!bs[i]["url"]) fail(join(p, "url"), "is required");
    parse_url(get_string(bs[i]["url"], join(p, "url")), b, join(p, "url"));
    if (!urls.insert(b.url).second) fail(join(p, "url"), "'" + b.url + "' is listed twice");
    if (bs[i]["version"]) b.version = get_string(bs[i]["version"], join(p, "version"));
    if (bs[i]["weight"]) b.weight = static_cast<std::uint32_t>(get_int(bs[i]["weight"], join(p, "weight"), 0, 1000000));
    total_weight += b.weight;
    m.backends.push_back(std::move(b));
  }
  if (total_weight == 0) fail(join(path, "backends"), "weights must not all be 0");
  return m;
}

GatewayConfig parse_root(const YAML::Node& root) {
  check_keys(root, "", {"listen", "models", "timeouts_ms", "health", "eject", "prefix", "scrape_interval_ms", "dns_refresh_ms",
                        "max_attempts", "access_log", "io_threads", "max_connections", "keys_db", "key_secret_file", "audit", "tenants", "redis", "guard", "admin_listen"});
  GatewayConfig c;
  if (root["listen"]) std::tie(c.listen_host, c.listen_port) = parse_listen(get_string(root["listen"], "listen"), "listen");
  if (root["admin_listen"]) std::tie(c.admin_host, c.admin_port) = parse_listen(get_string(root["admin_listen"], "admin_listen"), "admin_listen");
  const auto ms = root["models"];
  if (!ms) fail("models", "is required");
  if (!ms.IsSequence() || ms.size() == 0) fail("models", "must be a non-empty list");
  for (std::size_t i = 0; i < ms.size(); ++i) {
    auto m = parse_model(ms[i], "models[" + std::to_string(i) + "]");
    if (c.find_model(m.name)) fail("models[" + std::to_string(i) + "].name", "'" + m.name + "' is listed twice");
    c.models.push_back(std::move(m));
  }
  if (const auto t = root["timeouts_ms"]) {
    check_keys(t, "timeouts_ms", {"connect", "first_token", "idle", "total"});
    if (t["connect"]) c.timeouts.connect = get_ms(t["connect"], "timeouts_ms.connect");
    if (t["first_token"]) c.timeouts.first_token = get_ms(t["first_token"], "timeouts_ms.first_token");
    if (t["idle"]) c.timeouts.idle = get_ms(t["idle"], "timeouts_ms.idle");
    if (t["total"]) c.timeouts.total = get_ms(t["total"], "timeouts_ms.total");
  }
  if (const auto h = root["health"]) {
    check_keys(h, "health", {"interval_ms", "fail_after", "pass_after", "timeout_ms"});
    if (h["interval_ms"]) c.health.interval = get_ms(h["interval_ms"], "health.interval_ms", 10);
    if (h["fail_after"]) c.health.fail_after = static_cast<int>(get_int(h["fail_after"], "health.fail_after", 1, 100));
    if (h["pass_after"]) c.health.pass_after = static_cast<int>(get_int(h["pass_after"], "health.pass_after", 1, 100));
    if (h["timeout_ms"]) c.health.timeout = get_ms(h["timeout_ms"], "health.timeout_ms");
  }
  if (const auto e = root["eject"]) {
    check_keys(e, "eject", {"base_ms", "max_ms"});
    if (e["base_ms"]) c.eject.base = get_ms(e["base_ms"], "eject.base_ms");
    if (e["max_ms"]) c.eject.max = get_ms(e["max_ms"], "eject.max_ms");
    if (c.eject.max < c.eject.base) fail("eject.max_ms", "must not be below eject.base_ms");
  }
  if (const auto p = root["prefix"]) {
    check_keys(p, "prefix", {"block_chars", "blocks", "max_entries", "balance_threshold"});
    if (p["block_chars"]) c.prefix.block_chars = static_cast<std::size_t>(get_int(p["block_chars"], "prefix.block_chars", 1, 1 << 20));
    if (p["blocks"]) c.prefix.blocks = static_cast<std::size_t>(get_int(p["blocks"], "prefix.blocks", 1, 4096));
    if (p["max_entries"]) c.prefix.max_entries = static_cast<std::size_t>(get_int(p["max_entries"], "prefix.max_entries", 1, 1 << 26));
    if (p["balance_threshold"]) c.prefix.balance_threshold = get_int(p["balance_threshold"], "prefix.balance_threshold", 0, 1 << 20);
  }
  if (root["scrape_interval_ms"]) c.scrape_interval = get_ms(root["scrape_interval_ms"], "scrape_interval_ms", 10);
  if (root["dns_refresh_ms"]) c.dns_refresh = get_ms(root["dns_refresh_ms"], "dns_refresh_ms", 100);
  if (root["max_attempts"]) c.max_attempts = static_cast<int>(get_int(root["max_attempts"], "max_attempts", 1, 100));
  if (root["access_log"]) c.access_log = get_bool(root["access_log"], "access_log");
  if (root["io_threads"]) c.io_threads = static_cast<int>(get_int(root["io_threads"], "io_threads", 1, 1024));
  if (root["max_connections"]) c.max_connections = static_cast<std::size_t>(get_int(root["max_connections"], "max_connections", 1, 10000000));
  if (root["keys_db"]) c.keys_db = get_string(root["keys_db"], "keys_db");
  if (root["key_secret_file"]) c.key_secret_file = get_string(root["key_secret_file"], "key_secret_file");
  if (c.keys_db.empty() != c.key_secret_file.empty()) fail(c.keys_db.empty() ? "keys_db" : "key_secret_file", "keys_db and key_secret_file go together");
  if (const auto a = root["audit"]) {
    check_keys(a, "audit", {"dir", "fail_closed", "segment_kb", "sync"});
    if (!a["dir"]) fail("audit.dir", "is required");
    c.audit.dir = get_string(a["dir"], "audit.dir");
    if (a["fail_closed"]) c.audit.fail_closed = get_bool(a["fail_closed"], "audit.fail_closed");
    if (a["segment_kb"]) c.audit.segment_bytes = static_cast<std::size_t>(get_int(a["segment_kb"], "audit.segment_kb", 1, 1 << 22)) << 10;
    if (a["sync"]) c.audit.sync = get_bool(a["sync"], "audit.sync");
  }
  if (root["redis"]) {
    const auto r = get_string(root["redis"], "redis");
    const auto colon = r.rfind(':');
    if (colon == std::string::npos || colon == 0) fail("redis", "must be host:port, not '" + r + "'");
    c.redis_host = r.substr(0, colon);
    int port = 0;
    const auto* end = r.data() + r.size();
    if (std::from_chars(r.data() + colon + 1, end, port).ptr != end || port < 1 || port > 65535) fail("redis", "must be host:port, not '" + r + "'");
    c.redis_port = port;
  }
  if (const auto g = root["guard"]) {
    check_keys(g, "guard", {"default_rules", "injection_model", "injection_threshold", "injection_threshold_unanchored", "injection_examples", "benign_examples"});
    if (g["injection_examples"]) c.guard_injection_examples = get_string(g["injection_examples"], "guard.injection_examples");
    if (g["benign_examples"]) c.guard_benign_examples = get_string(g["benign_examples"], "guard.benign_examples");
    if (g["default_rules"]) c.guard_default_rules = get_bool(g["default_rules"], "guard.default_rules");
    if (g["injection_model"]) c.guard_injection_model = get_bool(g["injection_model"], "guard.injection_model");
    auto probability = [&](const char* key, double& out) {
      const auto t = g[key];
      if (!t) return;
      const auto s = t.IsScalar() ? t.as<std::string>() : std::string();
      double v = -1;
      const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || ec != std::errc() || p != s.data() + s.size() || !(v > 0 && v <= 1)) {
        fail(std::string("guard.") + key, "must be a probability above 0 and at most 1, not '" + s + "'");
      }
      out = v;
    };
    probability("injection_threshold", c.guard_injection_threshold);
    probability("injection_threshold_unanchored", c.guard_injection_threshold_unanchored);
  }
  if (const auto ts = root["tenants"]) {
    if (!ts.IsMap()) fail("tenants", "must be a mapping of tenant names");
    for (const auto& kv : ts) {
      const auto name = kv.first.as<std::string>();
      const auto path = "tenants." + name;
      const auto& t = kv.second;
      TenantConfig tc;
      if (!t.IsNull()) {
        check_keys(t, path, {"audit_content", "deny", "allow", "keywords_file"});
        for (const char* list : {"deny", "allow"}) {
          const auto l = t[list];
          if (!l) continue;
          const auto lp = path + "." + list;
          if (!l.IsSequence()) fail(lp, "must be a list of regexes");
          auto& out = std::string(list) == "deny" ? tc.deny : tc.allow;
          for (std::size_t i = 0; i < l.size(); ++i) out.push_back(get_string(l[i], lp + "[" + std::to_string(i) + "]"));
        }
        if (t["keywords_file"]) tc.keywords_file = get_string(t["keywords_file"], path + ".keywords_file");
        if (t["audit_content"]) {
          const auto v = get_string(t["audit_content"], path + ".audit_content");
          if (v == "redacted") tc.audit_content = TenantConfig::AuditContent::kRedacted;
          else if (v != "none") fail(path + ".audit_content", "must be none or redacted");
        }
      }
      c.tenants.emplace(name, tc);
    }
  }
  return c;
}

}  // namespace

Result<GatewayConfig> parse_config(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return error(StatusCode::kInvalidArgument, "not valid YAML (line " + std::to_string(e.mark.line + 1) + ")");
  }
  try {
    return parse_root(root);
  } catch (const ConfigError& e) {
    return error(StatusCode::kInvalidArgument, e.message);
  } catch (const YAML::Exception& e) {
    return error(StatusCode::kInvalidArgument, std::string("unexpected YAML: ") + e.what());
  }
}

Result<GatewayConfig> load_config(const std::string& path) {
  auto text = read_file(path);
  if (!text) return error(text.error());
  auto c = parse_config(*text);
  if (!c) return error(StatusCode::kInvalidArgument, path + ": " + c.error().message());
  return c;
}

}  // namespace lmserve::gateway
