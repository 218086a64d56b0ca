// The gateway's configuration: the issue's example parses to what it says, and each kind of
// mistake is refused with a message naming the key.
#include "gateway/config.h"

#include <gtest/gtest.h>

namespace lmserve::gateway {
namespace {

constexpr const char* kExample = R"(
listen: 127.0.0.1:8080
models:
  - name: qwen-7b
    policy: kv_aware
    affinity: {header: x-session-id}
    backends:
      - {url: http://10.0.0.1:8000, version: v1, weight: 90}
      - {url: http://10.0.0.2:8000, version: v2, weight: 10}
    canary: {header: x-lmserve-version, sticky: user}
timeouts_ms: {connect: 1000, first_token: 60000, idle: 30000, total: 600000}
health: {interval_ms: 1000, fail_after: 2, pass_after: 2}
)";

TEST(GatewayConfig, TheIssueExampleParses) {
  auto c = parse_config(kExample);
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(c->listen_host, "127.0.0.1");
  EXPECT_EQ(c->listen_port, 8080);
  ASSERT_EQ(c->models.size(), 1u);
  const auto& m = c->models[0];
  EXPECT_EQ(m.name, "qwen-7b");
  EXPECT_EQ(m.policy, Policy::kKvAware);
  EXPECT_TRUE(m.affinity.enabled);
  EXPECT_EQ(m.affinity.header, "x-session-id");
  ASSERT_EQ(m.backends.size(), 2u);
  EXPECT_EQ(m.backends[0].host, "10.0.0.1");
  EXPECT_EQ(m.backends[0].port, 8000);
  EXPECT_EQ(m.backends[1].version, "v2");
  EXPECT_EQ(m.backends[1].weight, 10u);
  EXPECT_EQ(m.canary.header, "x-lmserve-version");
  EXPECT_EQ(m.canary.sticky, CanaryConfig::Sticky::kUser);
  EXPECT_EQ(c->timeouts.first_token.count(), 60000);
  EXPECT_EQ(c->health.fail_after, 2);
  EXPECT_EQ(c->scrape_interval.count(), 100);  // 10 Hz by default
}

TEST(GatewayConfig, AuditAndTenants) {
  auto c = parse_config(
      "audit: {dir: /var/log/lmserve/audit, fail_closed: false, segment_kb: 512}\nredis: 127.0.0.1:6379\n"
      "guard: {default_rules: true, injection_threshold: 0.9, injection_threshold_unanchored: 0.95, injection_examples: /etc/lmserve/attacks.txt, benign_examples: /etc/lmserve/ok.txt}\n"
      "tenants:\n  compliance: {audit_content: redacted, deny: ['(?i)password'], allow: [a, b], keywords_file: /etc/w.txt}\n  retrieval: {audit_content: none}\n  plain:\n"
      "models: [{name: m, backends: [{url: 'http://a:1'}]}]");
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(c->audit.dir, "/var/log/lmserve/audit");
  EXPECT_FALSE(c->audit.fail_closed);
  EXPECT_EQ(c->audit.segment_bytes, 512u << 10);
  EXPECT_EQ(c->redis_host, "127.0.0.1");
  EXPECT_EQ(c->redis_port, 6379);
  EXPECT_EQ(c->tenant("compliance").audit_content, TenantConfig::AuditContent::kRedacted);
  EXPECT_TRUE(c->guard_default_rules);
  EXPECT_TRUE(c->guard_injection_model);  // on with the default rules unless turned off
  EXPECT_EQ(c->guard_injection_threshold, 0.9);
  EXPECT_EQ(c->guard_injection_threshold_unanchored, 0.95);
  EXPECT_EQ(c->guard_injection_examples, "/etc/lmserve/attacks.txt");
  EXPECT_EQ(c->guard_benign_examples, "/etc/lmserve/ok.txt");
  EXPECT_EQ(c->tenant("compliance").deny, std::vector<std::string>{"(?i)password"});
  EXPECT_EQ(c->tenant("compliance").allow.size(), 2u);
  EXPECT_EQ(c->tenant("compliance").keywords_file, "/etc/w.txt");
  EXPECT_EQ(c->tenant("retrieval").audit_content, TenantConfig::AuditContent::kNone);
  EXPECT_EQ(c->tenant("plain").audit_content, TenantConfig::AuditContent::kNone);
  EXPECT_EQ(c->tenant("unlisted").audit_content, TenantConfig::AuditContent::kNone);
  auto d = parse_config("models: [{name: m, backends: [{url: 'http://a:1'}]}]");
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->audit.dir.empty());
  EXPECT_TRUE(d->audit.fail_closed);  // the default, once a directory is named
}

TEST(GatewayConfig, DnsNamesAndDefaultPorts) {
  auto c = parse_config("models: [{name: m, backends: [{url: 'http://replicas.ns.svc.cluster.local'}, {url: 'http://[::1]:9000/'}]}]");
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(c->models[0].backends[0].host, "replicas.ns.svc.cluster.local");
  EXPECT_EQ(c->models[0].backends[0].port, 80);
  EXPECT_EQ(c->models[0].backends[1].host, "::1");
  EXPECT_EQ(c->models[0].backends[1].port, 9000);
  EXPECT_EQ(c->models[0].policy, Policy::kLeastOutstanding);
}

struct Bad {
  const char* yaml;
  const char* message;  // a part of the error
};

class GatewayConfigErrors : public ::testing::TestWithParam<Bad> {};

TEST_P(GatewayConfigErrors, NameTheKey) {
  auto c = parse_config(GetParam().yaml);
  ASSERT_FALSE(c) << GetParam().yaml;
  EXPECT_NE(c.error().message().find(GetParam().message), std::string::npos) << c.error().message();
  EXPECT_EQ(c.error().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(
    All, GatewayConfigErrors,
    ::testing::Values(Bad{"listen: 1.2.3.4:80", "models: is required"},
                      Bad{"models: []", "models: must be a non-empty list"},
                      Bad{"modles: []", "modles: unknown key"},
                      Bad{"keys_db: /tmp/k.sqlite\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "key_secret_file: keys_db and key_secret_file go together"},
                      Bad{"key_secret_file: /tmp/s\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "keys_db: keys_db and key_secret_file go together"},
                      Bad{"audit: {fail_closed: true}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "audit.dir: is required"},
                      Bad{"audit: {dir: /tmp/a, fail_open: true}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "audit.fail_open: unknown key"},
                      Bad{"audit: {dir: /tmp/a, segment_kb: 0}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "audit.segment_kb: must be between 1"},
                      Bad{"tenants: [a]\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "tenants: must be a mapping"},
                      Bad{"tenants: {c: {audit_content: full}}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "tenants.c.audit_content: must be none or redacted"},
                      Bad{"tenants: {c: {audit: x}}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "tenants.c.audit: unknown key"},
                      Bad{"models: [{name: m, default_max_tokens: 0, backends: [{url: 'http://a:1'}]}]", "models[0].default_max_tokens: must be between 1"},
                      Bad{"redis: localhost\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "redis: must be host:port, not 'localhost'"},
                      Bad{"redis: 'h:0'\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "redis: must be host:port"},
                      Bad{"guard: {rules: true}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "guard.rules: unknown key"},
                      Bad{"guard: {injection_model: yes}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "guard.injection_model: must be true or false"},
                      Bad{"guard: {injection_threshold: 0}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "guard.injection_threshold: must be a probability above 0"},
                      Bad{"guard: {injection_threshold: 1.5}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "guard.injection_threshold: must be a probability"},
                      Bad{"guard: {injection_threshold: high}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "not 'high'"},
                      Bad{"guard: {injection_threshold_unanchored: 0}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "guard.injection_threshold_unanchored: must be a probability above 0"},
                      Bad{"tenants: {c: {deny: '(?i)x'}}\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "tenants.c.deny: must be a list of regexes"},
                      Bad{"models: [{backends: [{url: 'http://a:1'}]}]", "models[0].name: is required"},
                      Bad{"models: [{name: m}]", "models[0].backends: is required"},
                      Bad{"models: [{name: m, backends: [{url: 'https://a:1'}]}]", "models[0].backends[0].url: must start with http://"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1/v1'}]}]", "without a path"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:99999'}]}]", "models[0].backends[0].url (port): must be between 1 and 65535"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1', weight: -3}]}]", "models[0].backends[0].weight: must be between"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1', weight: ten}]}]", "weight: must be an integer, not 'ten'"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1', wieght: 1}]}]", "models[0].backends[0].wieght: unknown key"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1', weight: 0}]}]", "weights must not all be 0"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1'}, {url: 'http://a:1/'}]}]", "is listed twice"},
                      Bad{"models: [{name: m, policy: random, backends: [{url: 'http://a:1'}]}]", "models[0].policy: must be round_robin"},
                      Bad{"models: [{name: m, canary: {sticky: cookie}, backends: [{url: 'http://a:1'}]}]", "models[0].canary.sticky: must be user"},
                      Bad{"models: [{name: m, affinity: {cookie: x}, backends: [{url: 'http://a:1'}]}]", "models[0].affinity.cookie: unknown key"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1'}]}, {name: m, backends: [{url: 'http://b:1'}]}]", "models[1].name: 'm' is listed twice"},
                      Bad{"listen: localhost:80\nmodels: [{name: m, backends: [{url: 'http://a:1'}]}]", "listen: 'localhost' is not an IP address"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1'}]}]\ntimeouts_ms: {connect: 0}", "timeouts_ms.connect: must be between 1"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1'}]}]\ntimeouts_ms: {first_byte: 10}", "timeouts_ms.first_byte: unknown key"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1'}]}]\nhealth: {fail_after: 0}", "health.fail_after: must be between 1 and 100"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1'}]}]\naccess_log: maybe", "access_log: must be true or false"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1'}]}]\neject: {base_ms: 5000, max_ms: 10}", "eject.max_ms: must not be below"},
                      Bad{"models: {name: m}", "models: must be a non-empty list"},
                      Bad{"models: [{name: m, backends: [{url: 'http://a:1'}]}\n", "not valid YAML"}));

}  // namespace
}  // namespace lmserve::gateway
