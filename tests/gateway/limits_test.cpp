// A key's limits at given times: sliding windows, Retry-After, reservations settled, atomic
// refusals, and exactness under many threads. The token counting of the limits (tokens.h) against
// real tokenizers.
#include "gateway/limits.h"
#include "gateway/tokens.h"

#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "redis_server.h"
#include "test_paths.h"
#include "text/tokenizer.h"

namespace lmserve::gateway {
namespace {

using Clock = Limiter::Clock;
using std::chrono::seconds;
using std::chrono::milliseconds;

const Clock::time_point kT0 = Clock::time_point(seconds(20'000 * 86400LL + 3600));  // 01:00 UTC

TEST(Limits, RequestsPerMinuteSlideAndSayWhenToComeBack) {
  auto l = make_local_limiter();
  const KeyLimits k{.rpm = 3};
  EXPECT_TRUE(l->admit("k", k, 1, 0, kT0).admitted);
  EXPECT_TRUE(l->admit("k", k, 2, 0, kT0 + seconds(30)).admitted);
  EXPECT_TRUE(l->admit("k", k, 3, 0, kT0 + seconds(40)).admitted);
  auto no = l->admit("k", k, 4, 0, kT0 + seconds(50));
  EXPECT_FALSE(no.admitted);
  EXPECT_EQ(no.limit, "rpm");
  EXPECT_EQ(no.retry_after_s, 10);  // the first leaves the window at 60 s
  EXPECT_NE(no.message.find("3 requests per minute"), std::string::npos) << no.message;
  EXPECT_TRUE(l->admit("k", k, 5, 0, kT0 + seconds(60)).admitted);
  EXPECT_FALSE(l->admit("k", k, 6, 0, kT0 + seconds(61)).admitted);
  EXPECT_TRUE(l->admit("other", k, 7, 0, kT0 + seconds(61)).admitted);  // per key
}

TEST(Limits, TokensPerMinuteReserveAtAdmissionAndSettleToWhatWasUsed) {
  auto l = make_local_limiter();
  const KeyLimits k{.tpm = 100};
  EXPECT_TRUE(l->admit("k", k, 1, 60, kT0).admitted);
  auto no = l->admit("k", k, 2, 50, kT0 + seconds(1));
  EXPECT_FALSE(no.admitted);
  EXPECT_EQ(no.limit, "tpm");
  EXPECT_EQ(no.retry_after_s, 59);  // the reservation leaves the window at 60 s
  l->settle("k", k, 1, 60, 20, kT0);  // the replica reported 20
  EXPECT_TRUE(l->admit("k", k, 2, 50, kT0 + seconds(2)).admitted);   // 70
  EXPECT_TRUE(l->admit("k", k, 3, 30, kT0 + seconds(3)).admitted);   // 100: exactly the limit
  EXPECT_FALSE(l->admit("k", k, 4, 1, kT0 + seconds(4)).admitted);
  l->settle("k", k, 2, 50, -1, kT0 + seconds(2));  // no count: the reservation stands
  EXPECT_FALSE(l->admit("k", k, 4, 1, kT0 + seconds(5)).admitted);
  EXPECT_TRUE(l->admit("k", k, 4, 20, kT0 + seconds(60)).admitted);  // the first 20 left
  auto alone = l->admit("k", k, 5, 101, kT0 + seconds(200));
  EXPECT_FALSE(alone.admitted);  // never fits
  EXPECT_NE(alone.message.find("this request alone reserves 101"), std::string::npos) << alone.message;
}

// A settlement finds its own request among thousands in the window, not a neighbour's: the
// difference shows when the entries leave the window.
TEST(Limits, ASettlementAmongManyCountsAgainstItsOwnRequest) {
  auto l = make_local_limiter();
  const KeyLimits k{.tpm = 500'050};
  for (int i = 0; i < 5000; ++i) ASSERT_TRUE(l->admit("k", k, static_cast<std::uint64_t>(i + 1), 100, kT0 + milliseconds(i)).admitted);
  l->settle("k", k, 1001, 100, 0, kT0 + milliseconds(1000));  // used nothing: 499,900 in the window
  // At 60.999 s the first 1,000 requests (100 each) have left: 399,900 remain, 100,150 fit.
  const auto t1 = kT0 + milliseconds(60'999);
  EXPECT_FALSE(l->admit("k", k, 6001, 100'151, t1).admitted);
  EXPECT_TRUE(l->admit("k", k, 6002, 100'150, t1).admitted);
  // At 61 s request 1001 leaves with the 0 it settled to: nothing more fits.
  EXPECT_FALSE(l->admit("k", k, 6003, 1, kT0 + milliseconds(61'000)).admitted);
}

// A request that outlives the window settles against nothing: its reservation left with its
// bucket, and the requests after it keep theirs.
TEST(Limits, ASettlementAfterItsRequestLeftTheWindowChangesNothing) {
  auto l = make_local_limiter();
  const KeyLimits k{.tpm = 1000};
  ASSERT_TRUE(l->admit("k", k, 1, 400, kT0).admitted);
  ASSERT_TRUE(l->admit("k", k, 2, 400, kT0 + seconds(30)).admitted);
  const auto t1 = kT0 + seconds(65);
  ASSERT_TRUE(l->admit("k", k, 5, 0, t1).admitted);  // the window moves on: request 1 leaves it
  l->settle("k", k, 1, 400, 100, kT0);               // 65 s after it began: 400 (request 2) in the window
  EXPECT_FALSE(l->admit("k", k, 3, 601, t1).admitted);
  EXPECT_TRUE(l->admit("k", k, 4, 600, t1).admitted);
}

// Times count to the millisecond, rounded up: an admission leaves the window at its own time or
// up to a millisecond later, never before.
TEST(Limits, AnAdmissionLeavesTheWindowNoEarlierThanItsTime) {
  auto l = make_local_limiter();
  const KeyLimits k{.rpm = 1};
  ASSERT_TRUE(l->admit("k", k, 1, 0, kT0 + std::chrono::microseconds(500)).admitted);
  EXPECT_FALSE(l->admit("k", k, 2, 0, kT0 + std::chrono::microseconds(60'000'500)).admitted);
  EXPECT_TRUE(l->admit("k", k, 3, 0, kT0 + milliseconds(60'001)).admitted);
}

// A thread that takes the lock with an earlier clock than the last admission's (it read the time
// first) counts at its own time: its reservation leaves the window when it should, and its
// settlement finds it rather than the later one.
TEST(Limits, AnEarlierClockCountsAtItsOwnTime) {
  auto l = make_local_limiter();
  const KeyLimits k{.tpm = 100};
  const auto x = kT0 + milliseconds(100), y = kT0 + std::chrono::microseconds(98'200);
  ASSERT_TRUE(l->admit("k", k, 1, 50, x).admitted);
  ASSERT_TRUE(l->admit("k", k, 2, 40, y).admitted);
  l->settle("k", k, 2, 40, 10, y);  // 60 in the window: 50 + 10
  EXPECT_FALSE(l->admit("k", k, 3, 41, x).admitted);
  EXPECT_TRUE(l->admit("k", k, 4, 40, x).admitted);  // 100
  // At 60.0995 s the earlier one (its millisecond: 99) has left, the later ones not.
  const auto t1 = kT0 + std::chrono::microseconds(60'099'500);
  EXPECT_FALSE(l->admit("k", k, 5, 11, t1).admitted);
  EXPECT_TRUE(l->admit("k", k, 6, 10, t1).admitted);
}

TEST(Limits, ConcurrencyAndTheDailyQuota) {
  auto l = make_local_limiter();
  const KeyLimits k{.max_concurrency = 2, .daily_tokens = 1000};
  EXPECT_TRUE(l->admit("k", k, 1, 400, kT0).admitted);
  EXPECT_TRUE(l->admit("k", k, 2, 400, kT0).admitted);
  auto busy = l->admit("k", k, 3, 1, kT0);
  EXPECT_EQ(busy.limit, "max_concurrency");
  EXPECT_EQ(busy.retry_after_s, 1);
  l->settle("k", k, 1, 400, 100, kT0);  // 500 used today
  auto day = l->admit("k", k, 3, 600, kT0 + seconds(1));
  EXPECT_EQ(day.limit, "daily_tokens");
  EXPECT_EQ(day.retry_after_s, 23 * 3600 - 1);  // until midnight UTC
  EXPECT_TRUE(l->admit("k", k, 3, 500, kT0 + seconds(1)).admitted);  // 1000: the quota exactly
  l->settle("k", k, 2, 400, 400, kT0);
  l->settle("k", k, 3, 500, 500, kT0 + seconds(1));
  EXPECT_FALSE(l->admit("k", k, 4, 1, kT0 + seconds(2)).admitted);
  EXPECT_TRUE(l->admit("k", k, 4, 1, kT0 + seconds(23 * 3600)).admitted);  // the next day
}

TEST(Limits, ARefusalTakesNothingFromTheOtherLimits) {
  auto l = make_local_limiter();
  const KeyLimits k{.rpm = 2, .tpm = 100};
  EXPECT_FALSE(l->admit("k", k, 1, 150, kT0).admitted);  // tokens refuse: no request counted
  EXPECT_TRUE(l->admit("k", k, 2, 50, kT0).admitted);
  EXPECT_TRUE(l->admit("k", k, 3, 50, kT0).admitted);
}

TEST(Limits, ManyThreadsAdmitExactlyTheLimit) {
  auto l = make_local_limiter();
  const KeyLimits k{.rpm = 500, .tpm = 7000};
  std::atomic<int> admitted{0}, tokens{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 16; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const int reserve = 1 + (i * 7 + t) % 20;
        if (l->admit("k", k, static_cast<std::uint64_t>(t * 1000 + i), reserve, kT0).admitted) {
          ++admitted;
          tokens += reserve;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_LE(admitted.load(), 500);
  EXPECT_LE(tokens.load(), 7000);
  EXPECT_TRUE(admitted.load() == 500 || tokens.load() > 7000 - 20) << admitted << " " << tokens;  // one of them is used up
}

TEST(PromptTokens, CountedAsTheModelsTokenizerAndTemplateDo) {
  const auto dir = lmserve::testing::shared_dir() / "data" / "tokenizers" / "Qwen2.5-7B-Instruct";
  auto c = PromptCounter::load(dir.string());
  ASSERT_TRUE(c) << c.error().message();
  auto tok = text::Tokenizer::load(dir);
  ASSERT_TRUE(tok);
  const std::string prompt = "Which documents does a compliance review of a mortgage need? 请列出。";
  EXPECT_EQ((*c)->count({{"prompt", prompt}}), static_cast<std::int64_t>((*tok)->encode(prompt).size()));
  EXPECT_EQ((*c)->count({{"prompt", {prompt, prompt}}}), 2 * static_cast<std::int64_t>((*tok)->encode(prompt).size()));
  EXPECT_EQ((*c)->count({{"prompt", {1, 2, 3}}}), 3);  // token ids
  // A chat: the template's markers around the content.
  const auto chat = (*c)->count({{"messages", {{{"role", "user"}, {"content", prompt}}}}});
  EXPECT_GT(chat, static_cast<std::int64_t>((*tok)->encode(prompt).size()) + 5);
  EXPECT_LT(chat, static_cast<std::int64_t>((*tok)->encode(prompt).size()) + 40);
  EXPECT_FALSE(PromptCounter::load("/nonexistent"));
  EXPECT_EQ(estimate_prompt_tokens({{"prompt", std::string(300, 'a')}}), 100);
}

// The same limits kept in Redis: two limiters (two gateways) share them exactly, settlement
// frees the window, and a server that goes away refuses rather than lets through.
TEST(RedisLimits, TwoGatewaysShareTheLimitsExactly) {
  lmserve::testing::RedisServer redis;
  auto a = make_redis_limiter("127.0.0.1", redis.port(), seconds(600));
  auto b = make_redis_limiter("127.0.0.1", redis.port(), seconds(600));
  ASSERT_TRUE(a && b) << (a ? "" : a.error().message());
  const auto now = Clock::now();
  const KeyLimits k{.rpm = 300, .tpm = 3000};
  std::atomic<int> admitted{0}, tokens{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 16; ++t) {
    ts.emplace_back([&, t] {
      auto& l = t % 2 ? **a : **b;
      for (int i = 0; i < 40; ++i) {
        const int reserve = 1 + (i * 7 + t) % 20;
        auto r = l.admit("k", k, static_cast<std::uint64_t>(t * 1000 + i), reserve, now);
        if (r.admitted) {
          ++admitted;
          tokens += reserve;
        } else {
          EXPECT_TRUE(r.limit == "rpm" || r.limit == "tpm") << r.limit;
          EXPECT_GE(r.retry_after_s, 1);
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_LE(admitted.load(), 300);
  EXPECT_LE(tokens.load(), 3000);
  EXPECT_TRUE(admitted.load() == 300 || tokens.load() > 3000 - 20) << admitted << " " << tokens;

  const KeyLimits t{.tpm = 100, .max_concurrency = 2};
  EXPECT_TRUE((*a)->admit("t", t, 1, 60, now).admitted);
  auto full = (*b)->admit("t", t, 2, 50, now);
  EXPECT_EQ(full.limit, "tpm");
  EXPECT_NE(full.message.find("100 tokens per minute"), std::string::npos);
  (*a)->settle("t", t, 1, 60, 20, now);  // the other gateway sees the settlement
  EXPECT_TRUE((*b)->admit("t", t, 2, 50, now).admitted);
  EXPECT_TRUE((*a)->admit("t", t, 3, 1, now).admitted);  // 2 and 3 under way
  EXPECT_EQ((*a)->admit("t", t, 4, 1, now).limit, "max_concurrency");
  (*b)->settle("t", t, 2, 50, 50, now);
  EXPECT_TRUE((*a)->admit("t", t, 4, 1, now).admitted);

  redis.stop();
  auto gone = (*a)->admit("t", t, 5, 1, now);
  EXPECT_FALSE(gone.admitted);
  EXPECT_TRUE(gone.unavailable);
  EXPECT_FALSE(make_redis_limiter("127.0.0.1", redis.port(), seconds(600)));  // checked at start
}

}  // namespace
}  // namespace lmserve::gateway
