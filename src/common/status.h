// Status and Result<T>: how every fallible path in lmserve reports failure.
//
// A function that can fail on input or I/O returns Status (no value) or Result<T>
// (= std::expected<T, Status>, see common/expected.h). Exceptions never cross a module boundary. The code says
// what kind of failure it is; the message says what happened, in words fit for an
// operator's log. Mapping to HTTP status and OpenAI error JSON happens once, in server/.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "common/expected.h"

namespace lmserve {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong (bad flag, malformed request, bad file)
  kNotFound,            // a named thing does not exist (file, model, route)
  kAlreadyExists,
  kOutOfRange,          // a value outside its allowed range (length over the model's limit)
  kResourceExhausted,   // a limit was hit (KV blocks, queue depth, quota); retrying later may work
  kFailedPrecondition,  // the system is not in a state to do this (not loaded, draining)
  kUnavailable,         // a dependency is down or unreachable (device, upstream replica)
  kDeadlineExceeded,
  kCancelled,           // the caller went away or asked to stop
  kUnimplemented,       // valid, but not supported by this build or this model
  kDataLoss,            // stored data is corrupt (truncated weights, bad header)
  kInternal,            // a bug: an invariant did not hold
};

// The code's name without the k, e.g. "InvalidArgument".
std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  // Lets `return error(...)` and LMSERVE_RETURN_IF_ERROR serve functions returning Status too.
  Status(Unexpected<Status> failure) : Status(std::move(failure.error())) {}  // NOLINT(implicit)

  static Status ok() { return {}; }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "InvalidArgument: message", or "OK".
  std::string to_string() const;

  // The same status with "context: " in front of the message; OK stays OK.
  Status with_context(std::string_view context) const;

  friend bool operator==(const Status&, const Status&) = default;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
using Result = Expected<T, Status>;

// Builds the error side of a Result: `return error(StatusCode::kNotFound, "no config.json");`
inline Unexpected<Status> error(StatusCode code, std::string message) {
  return Unexpected<Status>(Status(code, std::move(message)));
}
inline Unexpected<Status> error(Status status) { return Unexpected<Status>(std::move(status)); }

}  // namespace lmserve

// Returns early from a function returning Status or Result<T> when `expr` (a Status) fails.
#define LMSERVE_RETURN_IF_ERROR(expr)                             \
  do {                                                            \
    ::lmserve::Status lmserve_status_ = (expr);                   \
    if (!lmserve_status_.is_ok()) return ::lmserve::error(std::move(lmserve_status_)); \
  } while (false)
