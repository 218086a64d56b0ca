// text/json_prefix: every byte of a JSON document is a step of a prefix, the whole is complete,
// and what it takes whole is what a JSON parser (nlohmann's, independent) accepts.
#include "text/json_prefix.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cstdio>
#include <random>
#include <regex>

namespace lmserve::text {
namespace {

using json = nlohmann::json;

json random_value(std::mt19937& rng, int depth) {
  const int kind = static_cast<int>(rng() % (depth > 3 ? 6 : 8));
  switch (kind) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<std::int64_t>(rng()) - (1ll << 31);
    case 3: return std::ldexp(static_cast<double>(rng() % 100000), static_cast<int>(rng() % 60) - 30);
    case 4:
    case 5: {
      static const std::string kPieces[] = {"a", "Z", " ", "\"", "\\", "/", "\n", "\t", "\x01", "é", "中文", "😀", "{", "}", ":", ","};
      std::string s;
      for (int i = static_cast<int>(rng() % 6); i > 0; --i) s += kPieces[rng() % std::size(kPieces)];
      return s;
    }
    case 6: {
      json a = json::array();
      for (int i = static_cast<int>(rng() % 4); i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int i = static_cast<int>(rng() % 4); i > 0; --i) {
        char key[8];
        std::snprintf(key, sizeof key, "k%u", static_cast<unsigned>(rng() % 10));
        o[key] = random_value(rng, depth + 1);
      }
      return o;
    }
  }
}

// Fed whole: false at the first byte refused.
bool takes(JsonPrefix& p, std::string_view s) {
  for (unsigned char b : s) {
    if (!p.advance(b)) return false;
  }
  return true;
}

TEST(JsonPrefix, DocumentsAreTakenByteByByteAndCompleteOnlyAtTheirEnd) {
  std::mt19937 rng(11);
  for (int round = 0; round < 2000; ++round) {
    json doc = json::object();
    for (int i = static_cast<int>(rng() % 5); i > 0; --i) {
      char key[8];
      std::snprintf(key, sizeof key, "f%d", i);
      doc[key] = random_value(rng, 1);
    }
    const std::string text = round % 2 == 0 ? doc.dump() : doc.dump(static_cast<int>(rng() % 3) + 1);
    JsonPrefix p({.object_only = true, .max_depth = 32, .max_space_run = 64});
    for (std::size_t i = 0; i < text.size(); ++i) {
      ASSERT_FALSE(p.complete()) << text.substr(0, i);
      ASSERT_TRUE(p.advance(static_cast<unsigned char>(text[i]))) << "byte " << i << " of " << text;
    }
    EXPECT_TRUE(p.complete()) << text;
    EXPECT_TRUE(p.advance(std::string_view(" \n")));  // whitespace after
    EXPECT_FALSE(p.advance('x'));
    EXPECT_TRUE(p.complete());
  }
}

// Texts cut and changed at random: what the prefix takes whole and calls complete is what the
// parser accepts, and the reverse. (\u escapes are left out: the grammar takes any four hex
// digits, the parser refuses lone surrogates; so are exponents past a double's range.)
TEST(JsonPrefix, WholeTextsAgreeWithAParser) {
  std::mt19937 rng(5);
  static const std::string kBytes = "{}[]:,\" \\ntrue false null -0.5e+3 1 9 a \xC3\xA9 \xFF \x01";
  int agreed_accept = 0, agreed_reject = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string text = random_value(rng, 0).dump();
    if (rng() % 2 == 0) text = json{{"v", random_value(rng, 1)}}.dump();
    for (int edits = static_cast<int>(rng() % 3); edits > 0 && !text.empty(); --edits) {
      const std::size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0: text.erase(at, 1); break;
        case 1: text = text.substr(0, at) + kBytes[rng() % kBytes.size()] + text.substr(at); break;
        default: text[at] = kBytes[rng() % kBytes.size()];
      }
    }
    if (text.find("\\u") != std::string::npos) continue;
    static const std::regex kHugeExponent("[0-9][eE][+-]?[0-9]{3,}");  // grammatical; the parser refuses the overflow
    if (std::regex_search(text, kHugeExponent)) continue;
    const bool parser = json::accept(text) && json::parse(text).is_object();
    JsonPrefix p({.object_only = true, .max_depth = 32, .max_space_run = 64});
    const bool ours = takes(p, text) && p.complete();
    ASSERT_EQ(ours, parser) << text;
    (parser ? agreed_accept : agreed_reject)++;
  }
  EXPECT_GT(agreed_accept, 2000);
  EXPECT_GT(agreed_reject, 2000);
}

TEST(JsonPrefix, WhatIsRefusedLeavesTheStateAsItWas) {
  JsonPrefix p;
  EXPECT_FALSE(p.advance('['));  // json_object: an object at the top
  EXPECT_FALSE(p.advance('"'));
  EXPECT_TRUE(p.advance(std::string_view(R"({"a": [1, tr)")));
  EXPECT_FALSE(p.advance(std::string_view("ux")));  // all or nothing
  EXPECT_FALSE(p.advance('x'));
  EXPECT_TRUE(p.advance(std::string_view("ue], \"b\": \"\xE4\xB8")));  // in the middle of 中
  EXPECT_FALSE(p.advance('"'));                                        // the character is not whole
  EXPECT_FALSE(p.advance(0xC0));
  EXPECT_TRUE(p.advance(std::string_view("\xAD\"}")));
  EXPECT_TRUE(p.complete());
  JsonPrefix any({.object_only = false});
  EXPECT_TRUE(any.advance(std::string_view("-12.5e3")));
  EXPECT_TRUE(any.complete());
  EXPECT_FALSE(any.advance('.'));
}

TEST(JsonPrefix, SpaceRunsAndDepthAreLimited) {
  JsonPrefix p({.object_only = true, .max_depth = 3, .max_space_run = 4});
  EXPECT_TRUE(p.advance(std::string_view("{    ")));
  EXPECT_FALSE(p.advance(' '));  // a fifth in a row
  EXPECT_TRUE(p.advance(std::string_view("\"k     \":[[")));  // spaces inside a string are text
  EXPECT_FALSE(p.advance('['));  // a fourth level
  EXPECT_TRUE(p.advance(std::string_view("]]}")));
  EXPECT_TRUE(p.complete());
}

}  // namespace
}  // namespace lmserve::text
