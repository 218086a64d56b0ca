// gateway/errors: the gateway's own answers in OpenAI's error shape,
// {"error": {"message", "type", "param", "code"}}, with fixed messages.
#pragma once

#include <string>

#include "server/http/transport.h"

namespace lmserve::gateway {

// The JSON text of an error (type from the code: server_error for upstream failures).
std::string error_json(const std::string& message, const std::string& code);
server::http::Response error_response(int status, const std::string& message, const std::string& code);

}  // namespace lmserve::gateway
