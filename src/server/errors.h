// API errors: the one place where failures become an HTTP status and OpenAI's error body
// {"error": {"message", "type", "param", "code"}}. Messages are fixed text chosen here or by
// the engine's validation; they never echo raw request bytes.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"

namespace lmserve::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, ...
  std::string code;   // short machine-readable reason
  std::optional<std::string> param;
  int retry_after = 0;  // seconds, for 429 / 503

  std::string body() const;

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
};

}  // namespace lmserve::server
