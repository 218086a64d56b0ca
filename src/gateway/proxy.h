// gateway/proxy: one client request carried to a replica and its answer carried back.
//
// Everything of one call runs on the client connection's I/O thread (http::io_context_of): the
// upstream socket's handlers, its timers and the Exchange calls, so nothing hops between threads
// and no thread waits. Answers pass through as they come: a streamed (SSE) body is forwarded
// piece by piece, reading from the replica only while the client keeps up (backpressure through
// Exchange::queued_bytes/when_drained); other answers are whole and small, and are forwarded
// once complete, which keeps them retryable until then.
//
// Failure rules: until the first byte reaches the client, a failed replica (refused connection,
// timeout, 5xx, 429, a drop) is marked and the request goes to another (at most max_attempts
// replicas). After it, the stream ends with an SSE error event in OpenAI's shape and
// `data: [DONE]`. The client leaving closes the upstream connection at once, so the replica
// frees the request's KV cache.
#pragma once

#include <memory>
#include <string>

#include "gateway/state.h"
#include "server/http/transport.h"

namespace lmserve::gateway {

// What the gateway reads from a request's JSON body and headers to route it.
struct RouteInfo {
  std::string prompt;        // prompt text or the messages' contents (prefix_aware)
  std::string lane;          // sent upstream as x-lmserve-lane: the client's, or the key's
  std::string header_version;  // the canary header's value
  std::string sticky_key;
  std::string session_key;
  // With API keys: the key's id and tenant (for the log), and the client's Authorization header
  // kept from the replica.
  std::string key_id, tenant;
  bool drop_authorization = false;
  std::uint64_t id = 0;  // the request's id (State::next_id), as its audit record and log line name it
  bool audit_text = false;  // the audit keeps the prompt's and the answer's text (redacted)
  // The admission's record was written before the call (a stream's, or any while the trail
  // fails); else the outcome's record is the request's only one and carries the prompt's digest
  // and, with audit_text, `audit_prompt` (the prompt's text, redacted).
  bool admission_audited = false;
  std::string audit_prompt;
  std::shared_ptr<Grant> grant;  // the key's limits: settled when the call ends
};

// Starts proxying `exchange` for `model` (its answer follows on the exchange's thread).
void start_proxy(State& state, std::shared_ptr<Snapshot> snapshot, const ModelConfig& model, server::http::Exchange exchange,
                 RouteInfo info);

}  // namespace lmserve::gateway
