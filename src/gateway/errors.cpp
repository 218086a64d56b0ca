#include "gateway/errors.h"

#include <nlohmann/json.hpp>

namespace lmserve::gateway {

namespace {
const char* type_of(const std::string& code) {
  if (code == "model_not_found" || code == "invalid_request" || code == "not_found" || code == "method_not_allowed") return "invalid_request_error";
  if (code == "forbidden") return "permission_error";
  return "server_error";
}
}  // namespace

std::string error_json(const std::string& message, const std::string& code) {
  nlohmann::json j = {{"error", {{"message", message}, {"type", type_of(code)}, {"param", nullptr}, {"code", code}}}};
  return j.dump();
}

server::http::Response error_response(int status, const std::string& message, const std::string& code) {
  return {.status = status, .content_type = "application/json", .body = error_json(message, code)};
}

}  // namespace lmserve::gateway
