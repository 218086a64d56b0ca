// The routing rules without a network: canary splits and stickiness, rendezvous affinity (a
// replica leaving moves only its own sessions), the policies, the prefix map's bounds.
#include "gateway/router.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace lmserve::gateway {
namespace {

std::vector<Candidate> replicas(std::initializer_list<std::tuple<const char*, const char*, std::uint32_t>> xs) {
  std::vector<Candidate> cs;
  for (const auto& [url, version, weight] : xs) cs.push_back({.url = url, .version = version, .weight = weight});
  return cs;
}

TEST(Router, WeightedSplitIsWithinTwoPointsOverTenThousandDraws) {
  auto cs = replicas({{"a", "v1", 90}, {"b", "v2", 10}});
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  int v2 = 0;
  const int n = 10000;
  for (int i = 0; i < n; ++i) v2 += pick_version(cs, "", "", u(rng)) == "v2";
  EXPECT_NEAR(100.0 * v2 / n, 10.0, 2.0);
}

TEST(Router, StickyUsersKeepTheirVersionAndSplitByWeight) {
  auto cs = replicas({{"a", "v1", 80}, {"b", "v2", 20}});
  std::map<std::string, std::string> first;
  int v2 = 0;
  for (int i = 0; i < 5000; ++i) {
    const auto user = "user-" + std::to_string(i);
    first[user] = *pick_version(cs, "", user, 0.5);
    v2 += first[user] == "v2";
  }
  EXPECT_NEAR(100.0 * v2 / 5000, 20.0, 2.0);
  std::mt19937_64 rng(1);
  for (int round = 0; round < 3; ++round) {
    for (const auto& [user, v] : first) EXPECT_EQ(*pick_version(cs, "", user, std::uniform_real_distribution<double>(0, 1)(rng)), v);
  }
  // Raising the canary's weight moves users onto it only.
  auto more = replicas({{"a", "v1", 60}, {"b", "v2", 40}});
  for (const auto& [user, v] : first) {
    if (v == "v2") {
      EXPECT_EQ(*pick_version(more, "", user, 0.5), "v2") << user;
    }
  }
}

TEST(Router, HeaderPicksTheVersionAndAnUnavailableOneIsRefused) {
  auto cs = replicas({{"a", "v1", 90}, {"b", "v2", 10}});
  for (double d : {0.0, 0.5, 0.99}) EXPECT_EQ(pick_version(cs, "v2", "u", d), "v2");
  cs[1].available = false;
  EXPECT_EQ(pick_version(cs, "v2", "", 0.5), std::nullopt);
  EXPECT_EQ(pick_version(cs, "v3", "", 0.5), std::nullopt);
  // Without the header, a version with no replica gives way to the others.
  for (double d : {0.0, 0.95}) EXPECT_EQ(pick_version(cs, "", "", d), "v1");
  cs[0].available = false;
  EXPECT_EQ(pick_version(cs, "", "", 0.5), std::nullopt);
}

TEST(Router, AffinityMovesOnlyTheSessionsOfAReplicaThatLeaves) {
  auto cs = replicas({{"r0", "v", 1}, {"r1", "v", 1}, {"r2", "v", 1}, {"r3", "v", 1}});
  std::map<std::string, std::size_t> home;
  std::map<std::size_t, int> per;
  for (int i = 0; i < 4000; ++i) {
    const auto key = "session-" + std::to_string(i);
    home[key] = *pick_by_key(cs, "v", key);
    ++per[home[key]];
    EXPECT_EQ(*pick_by_key(cs, "v", key), home[key]);
  }
  for (const auto& [r, n] : per) EXPECT_NEAR(n, 1000, 150) << "replica " << r;  // spread evenly
  cs[2].available = false;
  int moved = 0;
  for (const auto& [key, r] : home) {
    const auto now = *pick_by_key(cs, "v", key);
    if (r == 2) {
      EXPECT_NE(now, 2u);
      ++moved;
    } else {
      EXPECT_EQ(now, r) << key << " moved though its replica stayed";
    }
  }
  EXPECT_EQ(moved, per[2]);
  cs[2].available = true;  // back: its sessions come home
  for (const auto& [key, r] : home) EXPECT_EQ(*pick_by_key(cs, "v", key), r);
}

TEST(Router, PoliciesChooseAsDocumented) {
  ModelConfig m;
  m.name = "m";
  auto cs = replicas({{"a", "v", 1}, {"b", "v", 1}, {"c", "v", 1}});
  m.policy = Policy::kRoundRobin;
  Router rr(m, {});
  std::map<std::size_t, int> seen;
  for (int i = 0; i < 30; ++i) ++seen[*rr.pick(cs, {})];
  EXPECT_EQ(seen, (std::map<std::size_t, int>{{0, 10}, {1, 10}, {2, 10}}));

  m.policy = Policy::kLeastOutstanding;
  Router lo(m, {});
  cs[0].outstanding = 5, cs[1].outstanding = 1, cs[2].outstanding = 3;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(*lo.pick(cs, {}), 1u);
  cs[1].available = false;
  EXPECT_EQ(*lo.pick(cs, {}), 2u);

  m.policy = Policy::kKvAware;
  Router kv(m, {});
  cs = replicas({{"a", "v", 1}, {"b", "v", 1}});
  cs[0].fresh = cs[1].fresh = true;
  cs[0].waiting = 6, cs[1].waiting = 0;
  cs[0].outstanding = 1, cs[1].outstanding = 3;  // fewer of ours on a, but a long queue there
  for (int i = 0; i < 5; ++i) EXPECT_EQ(*kv.pick(cs, {}), 1u);
  cs[1].fresh = false;  // b's scrape is stale: it counts as loaded
  EXPECT_EQ(*kv.pick(cs, {}), 0u);
  cs[0].waiting = 0, cs[1].fresh = true, cs[0].kv_usage = 0.95, cs[1].kv_usage = 0.1, cs[0].outstanding = cs[1].outstanding = 0;
  EXPECT_EQ(*kv.pick(cs, {}), 1u);
}

TEST(Router, PrefixAwareKeepsAPrefixOnItsReplicaUntilTheImbalancePassesTheThreshold) {
  ModelConfig m;
  m.name = "m";
  m.policy = Policy::kPrefixAware;
  PrefixConfig p;
  p.block_chars = 8;
  p.balance_threshold = 4;
  Router r(m, p);
  auto cs = replicas({{"a", "v", 1}, {"b", "v", 1}, {"c", "v", 1}});
  const std::string system = "You are a careful assistant for compliance questions. ";
  Router::Input in;
  in.prompt = system + "Question one?";
  const auto first = *r.pick(cs, in);
  for (int i = 0; i < 10; ++i) {
    in.prompt = system + "Another question " + std::to_string(i);
    EXPECT_EQ(*r.pick(cs, in), first);
  }
  cs[first].outstanding = 5;  // 5 above the others: past the threshold of 4
  in.prompt = system + "Yet another";
  const auto moved = *r.pick(cs, in);
  EXPECT_NE(moved, first);
  cs[first].outstanding = 0;
  in.prompt = system + "and again";
  EXPECT_EQ(*r.pick(cs, in), moved);  // the prefix now lives where it moved
}

TEST(Router, PrefixMapIsBoundedAndChainsBlocks) {
  PrefixConfig p;
  p.block_chars = 4;
  p.blocks = 3;
  p.max_entries = 5;
  PrefixMap map(p);
  EXPECT_TRUE(map.block_hashes("abc").empty());  // no full block
  auto h = map.block_hashes("aaaabbbbccccdddd");
  ASSERT_EQ(h.size(), 3u);  // at most `blocks`
  // Chained: the same block after a different prefix hashes differently.
  EXPECT_NE(map.block_hashes("xxxxbbbb")[1], h[1]);
  map.record(h, "r1");
  EXPECT_EQ(map.longest(map.block_hashes("aaaabbbbzzzz"))->second, 2u);
  map.record(map.block_hashes("qqqqrrrrssss"), "r2");
  EXPECT_EQ(map.size(), 5u);
  EXPECT_EQ(map.longest(h)->first, "r1");  // its first block was the oldest and went
  EXPECT_EQ(map.longest(h)->second, 3u);
  EXPECT_FALSE(map.longest(map.block_hashes("aaaa")));
}

}  // namespace
}  // namespace lmserve::gateway
