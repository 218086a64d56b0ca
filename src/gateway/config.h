// gateway/config: the gateway's YAML configuration, parsed and validated in one place. Every key
// is checked; an error names the key by its path ("models[0].backends[1].weight: ...").
//
//   listen: 127.0.0.1:8080
//   models:
//     - name: qwen-7b
//       policy: kv_aware              # round_robin | least_outstanding | kv_aware | prefix_aware
//       affinity: {header: x-session-id}
//       backends:
//         - {url: http://10.0.0.1:8000, version: v1, weight: 90}
//         - {url: http://replicas.ns.svc:8000, version: v2, weight: 10}   # every address of the name
//       canary: {header: x-lmserve-version, sticky: user}
//   timeouts_ms: {connect: 1000, first_token: 60000, idle: 30000, total: 600000}
//   health: {interval_ms: 1000, fail_after: 2, pass_after: 2}
//
// Further keys, all optional (defaults in the structs below): scrape_interval_ms, dns_refresh_ms,
// max_attempts, eject: {base_ms, max_ms}, prefix: {block_chars, blocks, max_entries,
// balance_threshold}, access_log, io_threads, max_connections.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "gateway/guard.h"

namespace lmserve::gateway {

enum class Policy { kRoundRobin, kLeastOutstanding, kKvAware, kPrefixAware };
const char* policy_name(Policy p);

struct BackendConfig {
  std::string url;   // as written
  std::string host;  // an IP address or a DNS name (every address it resolves to is a replica)
  std::uint16_t port = 80;
  std::string version = "default";
  std::uint32_t weight = 100;  // the version's share is the sum of its backends' weights
};

struct CanaryConfig {
  std::string header;  // a request header naming a version picks it ("" = none)
  enum class Sticky { kNone, kUser, kHeader } sticky = Sticky::kNone;
  std::string sticky_header;  // for sticky: {header: NAME}
};

struct AffinityConfig {
  bool enabled = false;
  std::string header;  // first the header, then the request's `user`, then the client address
};

struct ModelConfig {
  std::string name;
  Policy policy = Policy::kLeastOutstanding;
  AffinityConfig affinity;
  CanaryConfig canary;
  std::vector<BackendConfig> backends;
  // The token limits' counting (tokens.h): the model folder whose tokenizer (and chat template)
  // count a prompt (empty: estimated), and the completion tokens a request without max_tokens
  // reserves.
  std::string tokenizer;
  std::int64_t default_max_tokens = 1024;
};

struct Timeouts {
  std::chrono::milliseconds connect{1000};
  // Streamed answers: until the first byte of the body (the first token's event). Others: until
  // the replica's response head.
  std::chrono::milliseconds first_token{60000};
  std::chrono::milliseconds idle{30000};    // between two reads of a streamed body
  std::chrono::milliseconds total{600000};  // the whole exchange with the replica
};

struct HealthConfig {
  std::chrono::milliseconds interval{1000};
  int fail_after = 2;  // consecutive failed checks make a replica unhealthy
  int pass_after = 2;  // consecutive passed checks make it healthy again
  std::chrono::milliseconds timeout{0};  // per check; 0: the interval
};

struct EjectConfig {
  // Passive ejection (a connect error, a 5xx, a timeout): out for base, doubling on each further
  // failure up to max; a success resets it.
  std::chrono::milliseconds base{1000};
  std::chrono::milliseconds max{30000};
};

struct PrefixConfig {
  std::size_t block_chars = 64;      // the prompt is hashed in blocks of this many bytes
  std::size_t blocks = 32;           // at most this many leading blocks
  std::size_t max_entries = 65536;   // block hashes remembered (least recently used go)
  std::int64_t balance_threshold = 8;  // outstanding requests above the least loaded replica's
};

// The audit trail (audit.h): a record of every request that reached admission. Read at start;
// changing it takes a restart.
struct AuditConfig {
  std::string dir;  // empty: no audit trail
  bool fail_closed = true;  // a record that cannot be written refuses its request (503)
  std::size_t segment_bytes = 64 << 20;
  bool sync = false;  // fdatasync after each record
};

// What the gateway does per tenant (an API key's tenant).
struct TenantConfig {
  enum class AuditContent { kNone, kRedacted };
  AuditContent audit_content = AuditContent::kNone;  // redacted: prompt and answer text, redacted
  // The guard (guard.h): PCRE2 regexes that block, regexes whose matches are exempt, and a file
  // of keywords that block.
  std::vector<std::string> deny, allow;
  std::string keywords_file;
};

struct GatewayConfig {
  std::string listen_host = "127.0.0.1";
  int listen_port = 8080;
  // admin_listen: /metrics, /health, /ready and /admin/* on an address of their own (and /metrics
  // and /admin/* no longer on `listen`). Empty: all on `listen`. Changes take a restart.
  std::string admin_host;
  int admin_port = -1;
  std::vector<ModelConfig> models;
  Timeouts timeouts;
  HealthConfig health;
  EjectConfig eject;
  PrefixConfig prefix;
  std::chrono::milliseconds scrape_interval{100};  // kv_aware replicas' /metrics (10 Hz)
  std::chrono::milliseconds dns_refresh{5000};     // DNS names resolved again this often
  int max_attempts = 3;  // replicas tried for one request before anything reaches the client
  bool access_log = true;  // one JSON line per request
  int io_threads = 2;
  std::size_t max_connections = 10000;
  // API keys (keys.h): with keys_db set, every API request needs a valid key. Read at start;
  // changing them takes a restart.
  std::string keys_db, key_secret_file;
  AuditConfig audit;
  bool guard_default_rules = false;  // guard: {default_rules: true}: the shipped injection rules for every request
  bool guard_injection_model = true;  // guard.injection_model: with the default rules, the shipped model too
  // guard.injection_threshold / guard.injection_threshold_unanchored: the probabilities the model
  // blocks a text at that names an anchor / that names none.
  double guard_injection_threshold = kInjectionThreshold;
  double guard_injection_threshold_unanchored = kInjectionThresholdUnanchored;
  // guard.injection_examples / guard.benign_examples: files of the operator's own examples (the
  // corpus format of src/gateway/data), learnt with the shipped ones at every (re)load.
  std::string guard_injection_examples, guard_benign_examples;
  std::map<std::string, TenantConfig, std::less<>> tenants;
  // The keys' limits shared with other gateways through this Redis server (empty: this
  // process's counters). Read at start.
  std::string redis_host;
  int redis_port = 0;

  const ModelConfig* find_model(const std::string& name) const;
  const TenantConfig& tenant(std::string_view name) const;  // the defaults for one not listed
};

// InvalidArgument naming the key for anything wrong.
Result<GatewayConfig> parse_config(const std::string& yaml_text);
Result<GatewayConfig> load_config(const std::string& path);

}  // namespace lmserve::gateway
