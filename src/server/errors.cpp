#include "server/errors.h"

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace lmserve::server {

std::string ApiError::body() const {
  using ojson = nlohmann::ordered_json;
  ojson e = {{"message", message}, {"type", type}, {"param", param ? ojson(*param) : ojson()}, {"code", code}};
  // Error messages are ASCII or valid UTF-8 we wrote ourselves; replace anything else.
  return ojson({{"error", e}}).dump(-1, ' ', false, ojson::error_handler_t::replace);
}

http::Response ApiError::response() const {
  http::Response r{.status = status, .body = body()};
  if (retry_after > 0) r.headers.emplace_back("Retry-After", std::to_string(retry_after));
  return r;
}

ApiError ApiError::bad_request(std::string message, std::string code, std::optional<std::string> param) {
  return {400, std::move(message), "invalid_request_error", std::move(code), std::move(param)};
}
ApiError ApiError::unauthorized() {
  return {401, "Invalid or missing API key. Send it as 'Authorization: Bearer <key>'.", "authentication_error", "invalid_api_key", std::nullopt};
}
ApiError ApiError::not_found(std::string what) { return {404, std::move(what), "not_found_error", "not_found", std::nullopt}; }
ApiError ApiError::method_not_allowed() {
  return {405, "Method not allowed for this route.", "invalid_request_error", "method_not_allowed", std::nullopt};
}
ApiError ApiError::too_large() {
  return {413, "Request body is too large.", "invalid_request_error", "request_too_large", std::nullopt};
}
ApiError ApiError::headers_too_large() {
  return {431, "Request header fields are too large.", "invalid_request_error", "headers_too_large", std::nullopt};
}
ApiError ApiError::timeout() {
  return {408, "The request was not received in time.", "invalid_request_error", "request_timeout", std::nullopt};
}
ApiError ApiError::overloaded(std::string message, std::string code) {
  ApiError e{429, std::move(message), "rate_limit_error", std::move(code), std::nullopt};
  e.retry_after = 1;
  return e;
}
ApiError ApiError::unavailable(std::string message) {
  ApiError e{503, std::move(message), "service_unavailable", "unavailable", std::nullopt};
  e.retry_after = 5;
  return e;
}
ApiError ApiError::internal(std::string message) { return {500, std::move(message), "server_error", "internal_error", std::nullopt}; }

ApiError ApiError::from_status(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange: return bad_request(s.message());
    case StatusCode::kNotFound: return not_found(s.message());
    case StatusCode::kResourceExhausted: return overloaded(s.message(), "overloaded");
    case StatusCode::kUnavailable:
    case StatusCode::kFailedPrecondition: return unavailable(s.message());
    case StatusCode::kUnimplemented: return bad_request(s.message(), "not_supported");
    default: return internal("Internal error.");
  }
}

ApiError ApiError::from_transport(http::TransportError e) {
  switch (e) {
    case http::TransportError::kRequestTimeout: return timeout();
    case http::TransportError::kHeadersTooLarge: return headers_too_large();
    case http::TransportError::kBodyTooLarge: return too_large();
    case http::TransportError::kMalformed: return bad_request("Malformed HTTP request.", "bad_http");
    case http::TransportError::kTooManyConnections: {
      ApiError u = unavailable("Too many connections.");
      u.retry_after = 1;
      return u;
    }
    case http::TransportError::kInternal: return internal("Internal error.");
  }
  return internal("Internal error.");
}

ApiError ApiError::from_submit(const engine::SubmitError& e) {
  using engine::Rejection;
  switch (e.rejection) {
    case Rejection::kQueueFull: return overloaded(e.status.message(), "queue_full");
    case Rejection::kShuttingDown: return unavailable(e.status.message());
    case Rejection::kExceedsMaxModelLen:
    case Rejection::kPromptTooLong:
    case Rejection::kExceedsKvCapacity: return bad_request(e.status.message(), "context_length_exceeded");
    default: return from_status(e.status);
  }
}

}  // namespace lmserve::server
