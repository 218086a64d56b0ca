#include "common/log.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

namespace lmserve {
namespace {

TEST(Logging, AcceptsEveryDocumentedLevel) {
  for (const char* level : {"trace", "debug", "info", "warning", "error", "critical", "off"}) {
    EXPECT_TRUE(configure_logging({.level = level}).is_ok()) << level;
  }
  ASSERT_TRUE(configure_logging({.level = "error"}).is_ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::err);
  ASSERT_TRUE(configure_logging({.level = "debug", .json = true}).is_ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::debug);
}

TEST(Logging, RejectsUnknownLevelAndKeepsTheOldOne) {
  ASSERT_TRUE(configure_logging({.level = "warning"}).is_ok());
  Status s = configure_logging({.level = "verbose"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("verbose"), std::string::npos);
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::warn);
}

}  // namespace
}  // namespace lmserve
