// common/json_line: the text always parses, and gives back what was written (strings that are
// UTF-8, numbers), whatever bytes a string holds.
#include "common/json_line.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>

namespace lmserve {
namespace {

TEST(JsonLine, FieldsInTheirOrderAndTheirTypes) {
  JsonLine j;
  j.str("event", "completed").num("id", -42).real("ms", 0.125).boolean("stream", true).null("ttft_ms").num("big", std::numeric_limits<std::int64_t>::max());
  const auto text = std::move(j).done();
  EXPECT_EQ(text, R"({"event":"completed","id":-42,"ms":0.125,"stream":true,"ttft_ms":null,"big":9223372036854775807})");
  EXPECT_EQ(std::string(JsonLine().done()), "{}");
  // Fields past the short ones' buffer, plain and escaped, first and after others.
  const std::string long_plain(300, 'x'), long_key(200, 'k');
  JsonLine l;
  l.str(long_key, "v").str("a", long_plain).num(long_key + "2", 7).str("e", long_plain + "\n");
  const auto back = nlohmann::json::parse(std::move(l).done());
  EXPECT_EQ(back[long_key], "v");
  EXPECT_EQ(back["a"], long_plain);
  EXPECT_EQ(back[long_key + "2"], 7);
  EXPECT_EQ(back["e"], long_plain + "\n");
  EXPECT_EQ(back.size(), 4u);
}

TEST(JsonLine, EscapesAsJsonRequires) {
  const std::string s = std::string("q\"b\\s/n\nr\rt\tb\bf\f") + '\0' + "\x01\x1f\x7f é 中文 😀";
  JsonLine j;
  const auto text = std::move(j.str("s", s)).done();
  EXPECT_EQ(text, std::string(R"({"s":"q\"b\\s/n\nr\rt\tb\bf\f\u0000\u0001\u001f)") + "\x7f é 中文 😀\"}");
  EXPECT_EQ(nlohmann::json::parse(text)["s"].get<std::string>(), s);
}

TEST(JsonLine, BytesThatAreNotUtf8BecomeTheReplacementCharacter) {
  const std::pair<std::string, std::string> cases[] = {
      {"a\xff" "b", "a\xEF\xBF\xBD" "b"},            // not a lead byte
      {"\xC3", "\xEF\xBF\xBD"},                      // cut short at the end
      {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},      // overlong
      {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},  // a surrogate
      {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},  // past U+10FFFF
      {"\xE4\xB8" "x", "\xEF\xBF\xBD\xEF\xBF\xBD" "x"},  // a sequence broken off
  };
  for (const auto& [in, want] : cases) {
    const auto text = std::move(JsonLine().str("s", in)).done();
    const auto j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    EXPECT_EQ(j["s"].get<std::string>(), want);
  }
}

// Eight bytes at a time are passed over when none needs escaping: every ASCII byte, and a
// multi-byte character, at every position of strings around that width, escaped as nlohmann does.
TEST(JsonLine, EachByteIsEscapedWhereverItStandsInTheString) {
  for (std::size_t len = 1; len <= 26; ++len) {
    for (std::size_t at = 0; at < len; ++at) {
      for (int c = 0; c < 0x80; ++c) {
        std::string v(len, 'a');
        v[at] = static_cast<char>(c);
        std::string got;
        append_json_escaped(got, v);
        const std::string want = nlohmann::json(v).dump();
        ASSERT_EQ('"' + got + '"', want) << "byte " << c << " at " << at << " of " << len;
      }
      std::string v(len, 'b');
      v.replace(at, 1, "\xC3\xA9");  // é
      std::string got;
      append_json_escaped(got, v);
      ASSERT_EQ(got, v);
    }
  }
}

TEST(JsonLine, RandomBytesAlwaysParseAndUtf8ComesBackUnchanged) {
  std::mt19937 rng(7);
  for (int round = 0; round < 3000; ++round) {
    std::string s(rng() % 24, '\0');
    for (auto& c : s) c = static_cast<char>(rng() % 4 == 0 ? rng() % 0x20 : rng() % 256);
    const auto text = std::move(JsonLine().str("s", s).real("x", std::ldexp(static_cast<double>(rng()), static_cast<int>(rng() % 80) - 40))).done();
    const auto j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    // Valid UTF-8 (as nlohmann checks it when it writes) comes back byte for byte.
    bool valid = true;
    try {
      (void)nlohmann::json(s).dump();
    } catch (const nlohmann::json::exception&) {
      valid = false;
    }
    if (valid) {
      EXPECT_EQ(j["s"].get<std::string>(), s);
    }
  }
}

TEST(JsonLine, NumbersComeBackExactlyAndNonFiniteIsNull) {
  for (double v : {0.0, -0.5, 1e-9, 123456.789, 1e300, 0.1 + 0.2, 5e-324}) {
    const auto j = nlohmann::json::parse(std::move(JsonLine().real("v", v)).done());
    EXPECT_EQ(j["v"].get<double>(), v);
  }
  for (double v : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    EXPECT_EQ(std::move(JsonLine().real("v", v)).done(), R"({"v":null})");
  }
}

TEST(JsonLine, MillisecondsToTheMicrosecond) {
  const std::pair<double, const char*> cases[] = {
      {0.000753136, "0.753"}, {0.0125, "12.5"}, {2.0, "2000"},  {0.0, "0"},       {-0.0015, "-1.5"},
      {1e-7, "0"},            {0.0000006, "0.001"}, {0.010001, "10.001"}, {0.0100004, "10"}, {3600.000002, "3600000.002"},
      {-4e-7, "0"},           {0.020030, "20.03"}};
  for (const auto& [seconds, text] : cases) {
    EXPECT_EQ(std::move(JsonLine().millis("ms", seconds)).done(), std::string(R"({"ms":)") + text + "}") << seconds;
  }
  // Beyond exact integers of microseconds: still the value, as real() writes it.
  EXPECT_EQ(nlohmann::json::parse(std::move(JsonLine().millis("ms", 1e12)).done())["ms"].get<double>(), 1e15);
  for (double v : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(), std::nan("")}) {
    EXPECT_EQ(std::move(JsonLine().millis("ms", v)).done(), R"({"ms":null})");
  }
}

}  // namespace
}  // namespace lmserve
