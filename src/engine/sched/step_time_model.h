// How long a step takes, predicted from its shape: the scheduler's cost model for per-lane TPOT
// targets (SchedulerOptions: LaneOptions::tpot_target_s).
//
//   seconds = w0 + w_tokens x tokens + w_seqs x sequences + w_kv x kv_tokens + w_attn x attention
//
// where tokens are the step's new tokens (prefill chunks and one per decode), sequences its rows,
// kv_tokens the context its attention reads (each sequence's tokens after the step) and
// attention the query x key pairs of its prefill chunks (a chunk of n tokens ending at context c
// adds n x c), whose compute grows with the square of a long prompt. On a GPU w0 is the weight
// read a step always pays, w_tokens the GEMMs' compute per token, w_kv the attention's KV read,
// w_attn the prefill attention's compute; on the CPU the same form fits.
//
// Fitting: least squares over the steps observed, each weighing `decay` times the one after it
// (so the model follows clocks, power limits and the workload), pulled towards a prior — the
// start-up calibration's fit, or zero before one — with `prior_weight` (a ridge: steps that all
// look alike do not make the other coefficients drift). Coefficients are clamped at zero (no
// term makes a step faster). Pure arithmetic on the engine thread; not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace lmserve::engine {

struct StepShape {
  std::int64_t tokens = 0;
  std::int64_t seqs = 0;
  std::int64_t kv_tokens = 0;
  std::int64_t attention = 0;  // sum of n x context over chunks of n > 1 tokens
};

class StepTimeModel {
 public:
  static constexpr std::size_t kTerms = 5;  // 1, tokens, seqs, kv_tokens, attention
  // Seconds per unit of each term: {w0, per token, per sequence, per KV token, per query-key pair}.
  using Coefficients = std::array<double, kTerms>;

  explicit StepTimeModel(double decay = 0.999, double prior_weight = 4.0);

  // A fit of `shapes` to `seconds` (equal lengths) that becomes the prior, and the observations
  // so far are dropped: the start-up calibration.
  void calibrate(std::span<const StepShape> shapes, std::span<const double> seconds);
  // One measured step.
  void observe(const StepShape& shape, double seconds);

  // False until calibrate() or the first observe(): predictions are 0 then.
  bool ready() const { return ready_; }
  double predict(const StepShape& shape) const;
  // The most tokens one more sequence, with `context` tokens already in the cache, may bring to
  // a step so that the step's predicted time grows by at most `headroom` seconds (that sequence
  // adds its row, reads its context, and as a chunk of n > 1 tokens its query x key pairs). 0
  // when even one token does not fit; 2^62 when tokens cost nothing in the model.
  std::int64_t max_tokens_within(double headroom, std::int64_t context) const;
  const Coefficients& coefficients() const { return w_; }
  std::int64_t observations() const { return observations_; }

 private:
  void solve();

  double decay_, prior_weight_;
  Coefficients prior_{}, w_{};
  std::array<std::array<double, kTerms>, kTerms> xtx_{};  // decayed sums, in scaled units
  std::array<double, kTerms> xty_{};
  std::int64_t observations_ = 0;
  bool ready_ = false;
};

}  // namespace lmserve::engine
