#include "engine/sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace lmserve::engine {
namespace {

std::vector<float> logits(std::initializer_list<float> v) { return std::vector<float>(v); }

SampleResult run(std::vector<float> l, const SamplingParams& p, std::vector<std::int32_t> prompt = {},
                 std::vector<std::int32_t> output = {}, std::vector<std::int32_t> eos = {}, std::uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  return sample_token(l, p, prompt, output, eos, rng);
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(Sampler, GreedyTakesTheArgmax) { EXPECT_EQ(run(logits({0.1f, 2.0f, 1.9f}), greedy()).token, 1); }

TEST(Sampler, RepetitionPresenceAndFrequencyPenalties) {
  SamplingParams p = greedy();
  p.repetition_penalty = 2.0;  // 2.0 -> 1.0 for a seen positive logit
  EXPECT_EQ(run(logits({0.0f, 2.0f, 1.5f}), p, {1}).token, 2);
  SamplingParams q = greedy();
  q.presence_penalty = 0.3;
  q.frequency_penalty = 0.2;  // token 1 seen twice in the output: 2.0 - 0.3 - 0.4 = 1.3
  EXPECT_EQ(run(logits({0.0f, 2.0f, 1.5f}), q, {}, {1, 1}).token, 2);
  EXPECT_EQ(run(logits({0.0f, 2.0f, 1.5f}), q, {1, 1}, {}).token, 1);  // prompt tokens do not count
}

TEST(Sampler, MinTokensMasksEndTokensAndLogitBiasApplies) {
  SamplingParams p = greedy();
  p.min_tokens = 2;
  p.stop_token_ids = {2};
  EXPECT_EQ(run(logits({5.0f, 1.0f, 4.0f, 0.0f}), p, {}, {9}, {0}).token, 1);  // 0 (EOS) and 2 (stop) masked
  EXPECT_EQ(run(logits({5.0f, 1.0f, 4.0f, 0.0f}), p, {}, {9, 9}, {0}).token, 0);
  SamplingParams b = greedy();
  b.logit_bias = {{3, 10.0f}};
  EXPECT_EQ(run(logits({5.0f, 1.0f, 4.0f, 0.0f}), b).token, 3);
}

TEST(Sampler, TopKTopPAndMinPLimitTheCandidates) {
  std::vector<float> l = logits({3.0f, 2.9f, 0.0f, -1.0f, 2.8f});
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    SamplingParams k;
    k.top_k = 2;
    auto t = run(l, k, {}, {}, {}, seed).token;
    EXPECT_TRUE(t == 0 || t == 1) << t;
    SamplingParams m;
    m.min_p = 0.5;  // keeps tokens with p >= 0.5 * p(top): 0, 1, 4
    t = run(l, m, {}, {}, {}, seed).token;
    EXPECT_TRUE(t == 0 || t == 1 || t == 4) << t;
    SamplingParams p;
    p.top_p = 0.01;  // only the most likely token
    EXPECT_EQ(run(l, p, {}, {}, {}, seed).token, 0);
  }
}

TEST(Sampler, TemperatureSamplingFollowsTheDistribution) {
  std::vector<float> l = logits({std::log(0.6f), std::log(0.3f), std::log(0.1f)});
  SamplingParams p;
  std::map<std::int32_t, int> counts;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20000; ++i) {
    auto copy = l;
    counts[sample_token(copy, p, {}, {}, {}, rng).token]++;
  }
  EXPECT_NEAR(counts[0] / 20000.0, 0.6, 0.02);
  EXPECT_NEAR(counts[1] / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(counts[2] / 20000.0, 0.1, 0.02);
}

TEST(Sampler, SameSeedSameToken) {
  std::vector<float> l(1000);
  for (std::size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i));
  SamplingParams p;
  p.temperature = 1.3;
  EXPECT_EQ(run(l, p, {}, {}, {}, 77).token, run(l, p, {}, {}, {}, 77).token);
}

TEST(Sampler, LogprobsAreOfTheRawDistribution) {
  SamplingParams p = greedy();
  p.logprobs = 2;
  p.logit_bias = {{2, 100.0f}};
  auto r = run(logits({std::log(0.5f), std::log(0.25f), std::log(0.25f)}), p);
  EXPECT_EQ(r.token, 2);
  EXPECT_NEAR(r.logprob, std::log(0.25), 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 0);
  EXPECT_NEAR(r.top[0].logprob, std::log(0.5), 1e-5);
  EXPECT_EQ(r.top[1].token, 1);  // tie with 2: the lower id first
}

TEST(SamplingParams, RejectsInvalidValues) {
  auto bad = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    return !p.validate(100).is_ok();
  };
  EXPECT_TRUE(bad([](SamplingParams& p) { p.temperature = -1; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.temperature = std::nan(""); }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.top_p = 0; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.top_p = 1.5; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.top_k = -2; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.n = 0; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.n = 17; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.logprobs = 21; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.logit_bias = {{100, 1.0f}}; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.stop_token_ids = {-1}; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.min_tokens = 20; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.stop = {""}; }));
  EXPECT_FALSE(bad([](SamplingParams&) {}));
}

}  // namespace
}  // namespace lmserve::engine
