#include "common/status.h"

#include <gtest/gtest.h>

#include <set>
#include <string_view>

namespace lmserve {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return error(StatusCode::kInvalidArgument, "must be positive");
  return v;
}

Status check_twice(int v) {
  LMSERVE_RETURN_IF_ERROR(parse_positive(v) ? Status::ok() : parse_positive(v).error());
  LMSERVE_RETURN_IF_ERROR(v > 100 ? Status(StatusCode::kOutOfRange, "too big") : Status::ok());
  return Status::ok();
}

Result<int> doubled(int v) {
  LMSERVE_RETURN_IF_ERROR(check_twice(v));
  return 2 * v;
}

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.to_string(), "OK");
}

TEST(Status, CarriesCodeAndMessage) {
  Status s(StatusCode::kNotFound, "no config.json in /models/x");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.to_string(), "NotFound: no config.json in /models/x");
}

TEST(Status, WithContextPrefixesErrorsOnly) {
  Status s(StatusCode::kDataLoss, "header truncated");
  EXPECT_EQ(s.with_context("model.safetensors").message(), "model.safetensors: header truncated");
  EXPECT_EQ(s.with_context("x").code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Status::ok().with_context("x").is_ok());
  EXPECT_EQ(Status::ok().with_context("x").message(), "");
}

TEST(Status, EveryCodeHasADistinctName) {
  std::set<std::string_view> names;
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    names.insert(status_code_name(static_cast<StatusCode>(c)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(StatusCode::kInternal) + 1);
  EXPECT_FALSE(names.contains("Unknown"));
}

TEST(Result, ValueAndError) {
  auto ok = parse_positive(3);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(*ok, 3);
  auto bad = parse_positive(-1);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument);
}

TEST(Result, ReturnIfErrorPropagatesFirstFailure) {
  EXPECT_TRUE(check_twice(5).is_ok());
  EXPECT_EQ(check_twice(0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(check_twice(101).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(doubled(21).value(), 42);
  EXPECT_EQ(doubled(200).error(), Status(StatusCode::kOutOfRange, "too big"));
}

}  // namespace
}  // namespace lmserve
