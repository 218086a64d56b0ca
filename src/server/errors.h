// API errors: the one place where failures become an HTTP status and OpenAI's error body
// {"error": {"message", "type", "param", "code"}} — the request checks', the transport's (408,
// 413, 431, 400, 503) and the engine's rejections (429, 400, 503). Messages are fixed text
// chosen here or by the engine's validation; they never echo raw request bytes.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"
#include "server/http/transport.h"

namespace lmserve::engine {
struct SubmitError;
}

namespace lmserve::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, ...
  std::string code;   // short machine-readable reason
  std::optional<std::string> param;
  int retry_after = 0;  // seconds, for 429 / 503

  std::string body() const;
  // The whole HTTP answer: status, JSON body, Retry-After where set.
  http::Response response() const;

  static ApiError bad_request(std::string message, std::string code = "invalid_request", std::optional<std::string> param = std::nullopt);
  static ApiError unauthorized();
  static ApiError not_found(std::string what);
  static ApiError method_not_allowed();
  static ApiError too_large();
  static ApiError headers_too_large();
  static ApiError timeout();
  static ApiError overloaded(std::string message, std::string code);
  static ApiError unavailable(std::string message);
  static ApiError internal(std::string message);
  // From an engine/library Status (InvalidArgument -> 400, ResourceExhausted -> 429, ...).
  static ApiError from_status(const Status& s);
  // A failure the transport answered by itself.
  static ApiError from_transport(http::TransportError e);
  // An engine submit that failed: a rejection (queue full 429, too long 400, shutting down 503)
  // or bad input (400).
  static ApiError from_submit(const engine::SubmitError& e);
};

}  // namespace lmserve::server
