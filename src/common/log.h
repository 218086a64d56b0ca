// Logging: one process-wide spdlog logger, configured once by the CLI.
//
// Library code logs through spdlog's default logger (spdlog::info(...)); this header only
// owns the configuration, so that the format and level are the same for every subcommand.
// Thread-safe after configure_logging returns.
#pragma once

#include <string_view>

#include "common/status.h"

namespace lmserve {

struct LogOptions {
  std::string_view level = "info";  // trace, debug, info, warning, error, critical, off
  bool json = false;                // one JSON object per line, for log collectors
};

// Installs the stderr logger with `options`. InvalidArgument for an unknown level name.
Status configure_logging(const LogOptions& options);

}  // namespace lmserve
