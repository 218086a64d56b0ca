// gateway/access_log: one JSON object per line on stdout for every API request (proxied or
// refused by the gateway itself), and nothing else on that stream, so that a log collector
// (Kubernetes, journald) takes it as is; the gateway's own messages go to stderr. Never the
// prompt, the answer or a credential. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace lmserve::gateway {

struct AccessRecord {
  std::uint64_t id = 0;
  std::string model, backend, version, path, client, error;
  std::string key_id, tenant;  // with API keys: the key's id (never the key) and its tenant
  int status = 0;
  bool stream = false;
  int retries = 0;
  double ttft_s = -1;  // < 0: no byte of an answer came
  double total_s = 0;
};

void write_access_log(const AccessRecord& r);

// Now in UTC, ISO 8601 with milliseconds: "2026-12-02T18:30:00.123Z".
std::string utc_now();

}  // namespace lmserve::gateway
