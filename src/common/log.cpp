#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <array>
#include <memory>
#include <string>

namespace lmserve {
namespace {

struct LevelName {
  std::string_view name;
  spdlog::level::level_enum level;
};

constexpr std::array<LevelName, 8> kLevels{{
    {"trace", spdlog::level::trace},
    {"debug", spdlog::level::debug},
    {"info", spdlog::level::info},
    {"warning", spdlog::level::warn},
    {"warn", spdlog::level::warn},
    {"error", spdlog::level::err},
    {"critical", spdlog::level::critical},
    {"off", spdlog::level::off},
}};

}  // namespace

Status configure_logging(const LogOptions& options) {
  const LevelName* found = nullptr;
  for (const auto& l : kLevels) {
    if (l.name == options.level) found = &l;
  }
  if (found == nullptr) {
    return Status(StatusCode::kInvalidArgument,
                  "unknown log level '" + std::string(options.level) +
                      "' (expected trace, debug, info, warning, error, critical or off)");
  }
  // Built outside the registry: set_default_logger swaps it in under the same name, so the
  // logging can be reconfigured (tests do) without a name clash.
  auto logger = std::make_shared<spdlog::logger>("lmserve", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  logger->set_level(found->level);
  if (options.json) {
    logger->set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","thread":%t,"msg":"%v"})");
  } else {
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%-5l%$ %v");
  }
  spdlog::set_default_logger(std::move(logger));
  return Status::ok();
}

}  // namespace lmserve
