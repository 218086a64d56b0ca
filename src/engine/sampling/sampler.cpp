#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace lmserve::engine {
namespace {

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int k, std::vector<float>* all) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  all->resize(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) (*all)[i] = logits[i] - lse;
  std::vector<TokenLogprob> top;
  if (k <= 0) return top;
  std::vector<std::int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto cmp = [&](std::int32_t a, std::int32_t b) { return (*all)[static_cast<std::size_t>(a)] > (*all)[static_cast<std::size_t>(b)] || ((*all)[static_cast<std::size_t>(a)] == (*all)[static_cast<std::size_t>(b)] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), cmp);
  for (int i = 0; i < k; ++i) top.push_back({idx[static_cast<std::size_t>(i)], (*all)[static_cast<std::size_t>(idx[static_cast<std::size_t>(i)])]});
  return top;
}

}  // namespace

SampleResult sample_token(std::span<float> logits, const SamplingParams& p, std::span<const std::int32_t> prompt,
                          std::span<const std::int32_t> output, std::span<const std::int32_t> eos_ids, std::mt19937_64& rng) {
  SampleResult r;
  const auto V = static_cast<std::int32_t>(logits.size());
  std::vector<float> raw_logprobs;
  const bool want_logprobs = p.logprobs.has_value();
  if (want_logprobs) r.top = top_logprobs(logits, *p.logprobs, &raw_logprobs);

  if (p.repetition_penalty != 1.0) {
    std::vector<bool> seen(static_cast<std::size_t>(V), false);
    for (auto t : prompt) seen[static_cast<std::size_t>(t)] = true;
    for (auto t : output) seen[static_cast<std::size_t>(t)] = true;
    const float rp = static_cast<float>(p.repetition_penalty);
    for (std::int32_t t = 0; t < V; ++t) {
      if (!seen[static_cast<std::size_t>(t)]) continue;
      float& x = logits[static_cast<std::size_t>(t)];
      x = x > 0 ? x / rp : x * rp;
    }
  }
  if (p.presence_penalty != 0.0 || p.frequency_penalty != 0.0) {
    std::unordered_map<std::int32_t, int> counts;
    for (auto t : output) ++counts[t];
    for (const auto& [t, c] : counts) {
      logits[static_cast<std::size_t>(t)] -= static_cast<float>(p.presence_penalty + p.frequency_penalty * c);
    }
  }
  if (static_cast<std::int64_t>(output.size()) < p.min_tokens) {
    for (auto t : eos_ids) {
      if (t >= 0 && t < V) logits[static_cast<std::size_t>(t)] = -INFINITY;
    }
    for (auto t : p.stop_token_ids) logits[static_cast<std::size_t>(t)] = -INFINITY;
  }
  for (const auto& [t, b] : p.logit_bias) logits[static_cast<std::size_t>(t)] += b;

  auto logprob_of = [&](std::int32_t t) { return want_logprobs ? raw_logprobs[static_cast<std::size_t>(t)] : 0.0f; };
  if (p.greedy()) {
    r.token = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    r.logprob = logprob_of(r.token);
    return r;
  }

  // Candidates by descending logit (ties: lower id first), narrowed by top_k, top_p, min_p.
  std::vector<std::int32_t> idx(static_cast<std::size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](std::int32_t a, std::int32_t b) {
    float x = logits[static_cast<std::size_t>(a)], y = logits[static_cast<std::size_t>(b)];
    return x > y || (x == y && a < b);
  };
  std::size_t keep = idx.size();
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < keep) {
    keep = static_cast<std::size_t>(p.top_k);
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(keep), idx.end(), by_logit);
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  const double inv_t = 1.0 / p.temperature;
  const double top = static_cast<double>(logits[static_cast<std::size_t>(idx[0])]);
  std::vector<double> prob(keep);
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    prob[i] = std::exp((static_cast<double>(logits[static_cast<std::size_t>(idx[i])]) - top) * inv_t);
    total += prob[i];
  }
  if (p.top_p < 1.0) {  // the smallest prefix whose mass reaches top_p
    double cum = 0;
    std::size_t n = 0;
    while (n < keep && cum < p.top_p * total) cum += prob[n++];
    keep = std::max<std::size_t>(n, 1);
  }
  if (p.min_p > 0.0) {  // prob[0] is the largest
    std::size_t n = 1;
    while (n < keep && prob[n] >= p.min_p * prob[0]) ++n;
    keep = n;
  }
  total = std::accumulate(prob.begin(), prob.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  std::size_t pick = 0;
  for (double acc = prob[0]; pick + 1 < keep && acc <= u; acc += prob[++pick]) {
  }
  r.token = idx[pick];
  r.logprob = logprob_of(r.token);
  return r;
}

}  // namespace lmserve::engine
