// text::Regex: matches walked with find() are find_all's; the whole match is reported whatever the
// pattern's groups (one match-data block per thread); many threads may match at once.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "text/regex.h"

namespace lmserve::text {
namespace {

using Spans = std::vector<std::pair<std::size_t, std::size_t>>;

Regex compiled(std::string_view pattern) {
  auto r = Regex::compile(pattern);
  EXPECT_TRUE(r.has_value()) << pattern;
  return std::move(*r);
}

Spans walk(const Regex& r, std::string_view s) {
  Spans out;
  for (auto m = r.find(s, 0); m; m = r.find(s, m->second)) out.push_back(*m);
  return out;
}

TEST(Regex, FindsEveryNonOverlappingMatch) {
  const Regex r = compiled("ab+");
  EXPECT_EQ(r.find_all("xabbb ab a abab"), (Spans{{1, 5}, {6, 8}, {11, 13}, {13, 15}}));
  EXPECT_EQ(walk(r, "xabbb ab a abab"), r.find_all("xabbb ab a abab"));
  EXPECT_EQ(r.find("xabbb ab", 2), (std::pair<std::size_t, std::size_t>{6, 8}));  // starts at or after 2
  EXPECT_FALSE(r.find("xabbb ab", 8));
  EXPECT_TRUE(r.find_all("").empty());
}

// The one-pair match data still reports the whole match of a pattern with groups.
TEST(Regex, ReportsTheWholeMatchOfAPatternWithGroups) {
  const Regex r = compiled("(a)(b)(c)(d)?(?<name>e)");
  EXPECT_EQ(r.find_all("..abce..abcde"), (Spans{{2, 6}, {8, 13}}));
}

// Empty matches are skipped a whole character at a time: no span splits a UTF-8 sequence.
TEST(Regex, SkipsEmptyMatchesByWholeCharacters) {
  const Regex r = compiled("x*");
  const std::string s = "忽x略xx";  // 3-byte characters between the x's
  EXPECT_EQ(r.find_all(s), (Spans{{3, 4}, {7, 9}}));
  EXPECT_EQ(walk(r, s), r.find_all(s));
  const Regex words = compiled("\\p{L}+");
  EXPECT_EQ(words.find_all("ＡＢ c"), (Spans{{0, 6}, {7, 8}}));
}

TEST(Regex, RefusesAPatternThatDoesNotCompile) {
  auto r = Regex::compile("(unclosed");
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("does not compile"), std::string::npos);
}

// Each thread matches with its own match data: the same patterns on many threads give each
// thread the answers one thread gets.
TEST(Regex, ManyThreadsMatchAtOnce) {
  const Regex a = compiled("[0-9]+");
  const Regex b = compiled("(?i)ignore (all )?previous");
  const std::string s = "12 then IGNORE previous 345 and ignore all previous 6";
  const Spans want_a = a.find_all(s), want_b = b.find_all(s);
  ASSERT_EQ(want_a.size(), 3u);
  ASSERT_EQ(want_b.size(), 2u);
  std::vector<std::thread> threads;
  std::vector<int> wrong(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        if (walk(a, s) != want_a || walk(b, s) != want_b) ++wrong[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t;
}

}  // namespace
}  // namespace lmserve::text
