#include "common/json_depth.h"

#include <gtest/gtest.h>

#include <string>

namespace lmserve {
namespace {

std::string nested(int levels, char open, char close) { return std::string(static_cast<std::size_t>(levels), open) + std::string(static_cast<std::size_t>(levels), close); }

TEST(JsonDepth, CountsArraysAndObjectsButNotWhatStringsHold) {
  EXPECT_FALSE(json_deeper_than(""));
  EXPECT_TRUE(json_deeper_than(R"({"a":[1,{"b":[]}]})", 3));  // four levels
  EXPECT_FALSE(json_deeper_than(R"({"a":[1,{"b":[]}]})", 4));
  EXPECT_FALSE(json_deeper_than(nested(128, '[', ']')));
  EXPECT_TRUE(json_deeper_than(nested(129, '[', ']')));
  EXPECT_TRUE(json_deeper_than("{\"a\":" + nested(128, '[', ']') + "}"));
  // Brackets inside strings, escaped quotes and escaped backslashes are text.
  EXPECT_FALSE(json_deeper_than("[\"" + std::string(500, '[') + "\"]", 4));
  EXPECT_FALSE(json_deeper_than(R"(["\"[[[[[", "\\", "[[[[["])", 1));
  EXPECT_TRUE(json_deeper_than(R"(["\\"[[[)", 3));
  // Levels closed in between do not add up: depth, not count.
  std::string siblings;
  for (int i = 0; i < 1000; ++i) siblings += "[[]]";
  EXPECT_FALSE(json_deeper_than("[" + siblings + "]", 3));
  // Stray closers do not make room for more openers.
  EXPECT_TRUE(json_deeper_than(std::string(50, ']') + nested(5, '{', '}'), 4));
}

}  // namespace
}  // namespace lmserve
