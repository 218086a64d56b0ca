// Sampling on the device (cuda_ops.h, sample) against the host's definition of the same
// distribution (backend.h, RowSampling): greedy rows are the CPU argmax (ties: the lowest id);
// random rows never leave the set that top_k / top_p / min_p keep (ties at a cut kept) and,
// over many draws, follow its probabilities; a draw depends only on (key, counter).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "backend/cuda/model/cuda_ops.h"
#include "compare_util.h"

namespace lmserve::compare {
namespace {

namespace ops = cuda::ops;
using cuda::SampleSpec;

SampleSpec random_spec(float t, std::int32_t top_k = 0, float top_p = 1.0f, float min_p = 0.0f) {
  SampleSpec s;
  s.mode = 2;
  s.temperature = t;
  s.top_k = top_k;
  s.top_p = top_p;
  s.min_p = min_p;
  s.key_lo = 0x1234567u;
  s.key_hi = 0x89abcdefu;
  return s;
}

// The kept tokens' probabilities (0 elsewhere), in double on the host.
std::vector<double> kept_distribution(const std::vector<float>& l, const SampleSpec& s) {
  const std::size_t V = l.size();
  std::vector<std::size_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return l[a] > l[b]; });
  const double mx = l[idx[0]];
  float floor = -INFINITY;
  if (s.top_k > 0 && static_cast<std::size_t>(s.top_k) < V) floor = l[idx[static_cast<std::size_t>(s.top_k) - 1]];
  auto w = [&](std::size_t i) { return std::exp((l[i] - mx) / s.temperature); };
  if (s.top_p < 1.0f) {
    double total = 0;
    for (std::size_t i : idx) total += l[i] >= floor ? w(i) : 0.0;
    double cum = 0;
    for (std::size_t i : idx) {
      cum += w(i);
      if (cum >= s.top_p * total) {
        floor = std::max(floor, l[i]);
        break;
      }
    }
  }
  std::vector<double> p(V, 0.0);
  double sum = 0;
  for (std::size_t i = 0; i < V; ++i) {
    if (l[i] >= floor && w(i) >= s.min_p) sum += (p[i] = w(i));
  }
  for (double& x : p) x /= sum;
  return p;
}

// R draws of one row (counters 0..R-1): the count of each token.
std::map<std::int32_t, int> draw(const std::vector<float>& row, SampleSpec s, int R) {
  std::vector<float> logits;
  std::vector<SampleSpec> specs;
  for (int r = 0; r < R; ++r) {
    logits.insert(logits.end(), row.begin(), row.end());
    s.counter = static_cast<std::uint32_t>(r);
    specs.push_back(s);
  }
  std::vector<std::int32_t> tokens;
  EXPECT_EQ(ops::sample(logits, static_cast<int>(row.size()), specs, &tokens), "");
  std::map<std::int32_t, int> counts;
  for (auto t : tokens) ++counts[t];
  return counts;
}

// Every drawn token is kept; each kept token of probability >= 1% (and the rest together)
// within 5 standard deviations of its expected count.
void expect_follows(const std::map<std::int32_t, int>& counts, const std::vector<double>& p, int R) {
  double rest_p = 0;
  int rest_n = 0;
  for (const auto& [t, n] : counts) {
    ASSERT_GE(t, 0);
    ASSERT_LT(static_cast<std::size_t>(t), p.size());
    EXPECT_GT(p[static_cast<std::size_t>(t)], 0.0) << "token " << t << " is outside the kept set";
  }
  auto check = [&](double q, int n, const std::string& what) {
    const double sd = std::sqrt(R * q * (1 - q)), want = R * q;
    EXPECT_LE(std::abs(n - want), 5 * sd + 1) << what << ": " << n << " draws, expected " << want;
  };
  for (std::size_t t = 0; t < p.size(); ++t) {
    const auto it = counts.find(static_cast<std::int32_t>(t));
    const int n = it == counts.end() ? 0 : it->second;
    if (p[t] >= 0.01) {
      check(p[t], n, "token " + std::to_string(t));
    } else {
      rest_p += p[t];
      rest_n += n;
    }
  }
  if (rest_p > 0) check(rest_p, rest_n, "the tokens under 1%");
}

TEST(DeviceSampling, GreedyRowsAreTheArgmaxAndHostRowsAreLeft) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(31);
  const int V = 128256;  // Llama 3's vocabulary
  std::vector<float> logits = random_vec(rng, 6 * static_cast<std::size_t>(V), -20, 20);
  logits[V + 70000] = 30.0f;  // row 1: ties at the maximum take the lower id
  logits[V + 90000] = 30.0f;
  logits[2 * static_cast<std::size_t>(V) + V - 1] = 50.0f;  // row 2: the last id
  std::vector<SampleSpec> specs(6);
  for (int r = 0; r < 5; ++r) specs[static_cast<std::size_t>(r)].mode = 1;
  specs[3] = random_spec(1e-7f);  // too cold to divide by differences: the argmax
  specs[4] = random_spec(1.0f, 1);  // top_k 1: the argmax
  specs[5].mode = 0;                // left to the host
  std::vector<std::int32_t> got;
  ASSERT_EQ(ops::sample(logits, V, specs, &got), "");
  for (int r = 0; r < 5; ++r) {
    const float* row = logits.data() + static_cast<std::size_t>(r) * V;
    EXPECT_EQ(got[static_cast<std::size_t>(r)], std::max_element(row, row + V) - row) << "row " << r;
  }
  EXPECT_EQ(got[1], 70000);
  EXPECT_EQ(got[5], -1);
}

TEST(DeviceSampling, DrawsFollowTheKeptDistribution) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(32);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> row(1000);
  for (float& x : row) x = normal(rng);
  const int R = 20000;
  for (const SampleSpec& s : {random_spec(1.0f), random_spec(0.7f, 20), random_spec(1.3f, 0, 0.8f), random_spec(1.0f, 0, 1.0f, 0.1f),
                              random_spec(0.9f, 50, 0.9f, 0.02f), random_spec(2.0f, 500, 0.95f)}) {
    SCOPED_TRACE("temperature " + std::to_string(s.temperature) + " top_k " + std::to_string(s.top_k) + " top_p " +
                 std::to_string(s.top_p) + " min_p " + std::to_string(s.min_p));
    expect_follows(draw(row, s, R), kept_distribution(row, s), R);
  }
}

TEST(DeviceSampling, TiesAtTheTopKCutAreKept) {
  LMSERVE_REQUIRE_GPU();
  std::vector<float> row(64, -5.0f);
  row[10] = 5.0f;
  row[20] = 4.0f;
  row[30] = row[31] = row[32] = 3.0f;  // top_k 3 cuts through these three
  const SampleSpec s = random_spec(1.0f, 3);
  const int R = 20000;
  auto counts = draw(row, s, R);
  const auto p = kept_distribution(row, s);
  EXPECT_GT(p[32], 0.0);
  expect_follows(counts, p, R);
  EXPECT_GT(counts[32], 0);
}

TEST(DeviceSampling, ADrawDependsOnlyOnKeyAndCounter) {
  LMSERVE_REQUIRE_GPU();
  std::vector<float> row(512, 0.0f);  // flat: any token may come
  std::vector<float> logits;
  std::vector<SampleSpec> specs;
  for (int r = 0; r < 64; ++r) {
    logits.insert(logits.end(), row.begin(), row.end());
    SampleSpec s = random_spec(1.0f);
    s.key_lo = static_cast<std::uint32_t>(r % 32);  // rows r and r + 32: the same key and counter
    s.counter = 7;
    specs.push_back(s);
  }
  std::vector<std::int32_t> a, b;
  ASSERT_EQ(ops::sample(logits, 512, specs, &a), "");
  std::reverse(specs.begin(), specs.end());
  ASSERT_EQ(ops::sample(logits, 512, specs, &b), "");
  std::reverse(b.begin(), b.end());
  EXPECT_EQ(a, b) << "a row's token does not depend on its place in the batch";
  for (int r = 0; r < 32; ++r) EXPECT_EQ(a[static_cast<std::size_t>(r)], a[static_cast<std::size_t>(r) + 32]);
  std::sort(a.begin(), a.end());
  EXPECT_GE(std::unique(a.begin(), a.end()) - a.begin(), 20) << "32 keys over 512 equal tokens give varied draws";
}

// Every path of the kernel on a few rows (small enough for compute-sanitizer): each token
// inside its row's kept set.
TEST(DeviceSampling, EveryPathOnFewRows) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(34);
  const int V = 3000;
  const std::vector<SampleSpec> kinds = {random_spec(1.0f), random_spec(0.5f, 7), random_spec(1.0f, 0, 0.5f), random_spec(1.0f, 0, 1.0f, 0.3f),
                                         random_spec(0.8f, 100, 0.7f, 0.05f)};
  std::vector<float> logits = random_vec(rng, kinds.size() * 3 * static_cast<std::size_t>(V), -4, 4);
  std::vector<SampleSpec> specs;
  for (std::size_t r = 0; r < kinds.size() * 3; ++r) {
    specs.push_back(kinds[r % kinds.size()]);
    specs.back().counter = static_cast<std::uint32_t>(r);
  }
  std::vector<std::int32_t> got;
  ASSERT_EQ(ops::sample(logits, V, specs, &got), "");
  for (std::size_t r = 0; r < specs.size(); ++r) {
    const std::vector<float> row(logits.begin() + static_cast<std::ptrdiff_t>(r * V), logits.begin() + static_cast<std::ptrdiff_t>((r + 1) * V));
    ASSERT_GE(got[r], 0);
    ASSERT_LT(got[r], V);
    EXPECT_GT(kept_distribution(row, specs[r])[static_cast<std::size_t>(got[r])], 0.0) << "row " << r;
  }
}

TEST(DeviceSampling, ALargeVocabularyStaysInsideTheNucleus) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(33);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(152064);  // Qwen2.5's vocabulary
  for (float& x : row) x = normal(rng);
  const SampleSpec s = random_spec(0.8f, 0, 0.9f);
  const int R = 2000;
  expect_follows(draw(row, s, R), kept_distribution(row, s), R);
}

}  // namespace
}  // namespace lmserve::compare
