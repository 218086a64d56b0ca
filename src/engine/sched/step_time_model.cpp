#include "engine/sched/step_time_model.h"

#include <algorithm>
#include <cmath>

namespace lmserve::engine {
namespace {

// Each term in units that keep the normal equations well conditioned: a thousand tokens, a
// few hundred sequences, a million KV tokens and a 4k-token chunk at 4k context are all "about one".
constexpr std::array<double, StepTimeModel::kTerms> kScale = {1.0, 1024.0, 256.0, 1048576.0, 16777216.0};

std::array<double, StepTimeModel::kTerms> features(const StepShape& s) {
  return {1.0, static_cast<double>(s.tokens) / kScale[1], static_cast<double>(s.seqs) / kScale[2],
          static_cast<double>(s.kv_tokens) / kScale[3], static_cast<double>(s.attention) / kScale[4]};
}

using Matrix = std::array<std::array<double, StepTimeModel::kTerms>, StepTimeModel::kTerms>;
using Vector = std::array<double, StepTimeModel::kTerms>;

// Solves a x = b over the terms not in `zero` (those are 0) by Gaussian elimination with partial
// pivoting; a singular remainder leaves its terms at 0.
Vector solve_masked(Matrix a, Vector b, const std::array<bool, StepTimeModel::kTerms>& zero) {
  constexpr std::size_t n = StepTimeModel::kTerms;
  for (std::size_t i = 0; i < n; ++i) {
    if (!zero[i]) continue;
    for (std::size_t j = 0; j < n; ++j) a[i][j] = a[j][i] = 0;
    a[i][i] = 1;
    b[i] = 0;
  }
  std::array<std::size_t, n> row{};
  for (std::size_t i = 0; i < n; ++i) row[i] = i;
  Vector x{};
  for (std::size_t c = 0; c < n; ++c) {
    std::size_t p = c;
    for (std::size_t r = c + 1; r < n; ++r) {
      if (std::fabs(a[r][c]) > std::fabs(a[p][c])) p = r;
    }
    std::swap(a[c], a[p]);
    std::swap(b[c], b[p]);
    if (std::fabs(a[c][c]) < 1e-300) continue;
    for (std::size_t r = c + 1; r < n; ++r) {
      const double f = a[r][c] / a[c][c];
      for (std::size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (std::size_t c = n; c-- > 0;) {
    if (std::fabs(a[c][c]) < 1e-300) continue;
    double s = b[c];
    for (std::size_t k = c + 1; k < n; ++k) s -= a[c][k] * x[k];
    x[c] = s / a[c][c];
  }
  return x;
}

// Non-negative least squares by an active set small enough to be exhaustive in four steps:
// a term whose solution comes out negative is fixed at 0 and the rest solved again.
Vector solve_nonnegative(const Matrix& a, const Vector& b) {
  std::array<bool, StepTimeModel::kTerms> zero{};
  Vector x{};
  for (std::size_t round = 0; round <= StepTimeModel::kTerms; ++round) {
    x = solve_masked(a, b, zero);
    bool changed = false;
    for (std::size_t i = 0; i < StepTimeModel::kTerms; ++i) {
      if (x[i] < 0) zero[i] = changed = true;
    }
    if (!changed) break;
  }
  for (double& v : x) v = std::max(0.0, v);
  return x;
}

}  // namespace

StepTimeModel::StepTimeModel(double decay, double prior_weight) : decay_(decay), prior_weight_(prior_weight) {}

void StepTimeModel::calibrate(std::span<const StepShape> shapes, std::span<const double> seconds) {
  Matrix a{};
  Vector b{};
  for (std::size_t k = 0; k < shapes.size() && k < seconds.size(); ++k) {
    const auto x = features(shapes[k]);
    for (std::size_t i = 0; i < kTerms; ++i) {
      for (std::size_t j = 0; j < kTerms; ++j) a[i][j] += x[i] * x[j];
      b[i] += x[i] * seconds[k];
    }
  }
  for (std::size_t i = 0; i < kTerms; ++i) a[i][i] += 1e-9;  // an unexcited term stays at 0
  const Vector scaled = solve_nonnegative(a, b);
  for (std::size_t i = 0; i < kTerms; ++i) prior_[i] = scaled[i] / kScale[i];
  xtx_ = {};
  xty_ = {};
  observations_ = 0;
  w_ = prior_;
  ready_ = true;
}

void StepTimeModel::observe(const StepShape& shape, double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return;
  const auto x = features(shape);
  for (std::size_t i = 0; i < kTerms; ++i) {
    for (std::size_t j = 0; j < kTerms; ++j) xtx_[i][j] = decay_ * xtx_[i][j] + x[i] * x[j];
    xty_[i] = decay_ * xty_[i] + x[i] * seconds;
  }
  ++observations_;
  ready_ = true;
  solve();
}

void StepTimeModel::solve() {
  Matrix a = xtx_;
  Vector b = xty_;
  for (std::size_t i = 0; i < kTerms; ++i) {
    a[i][i] += prior_weight_;
    b[i] += prior_weight_ * prior_[i] * kScale[i];
  }
  const Vector scaled = solve_nonnegative(a, b);
  for (std::size_t i = 0; i < kTerms; ++i) w_[i] = scaled[i] / kScale[i];
}

double StepTimeModel::predict(const StepShape& s) const {
  return w_[0] + w_[1] * static_cast<double>(s.tokens) + w_[2] * static_cast<double>(s.seqs) + w_[3] * static_cast<double>(s.kv_tokens) +
         w_[4] * static_cast<double>(s.attention);
}

std::int64_t StepTimeModel::max_tokens_within(double headroom, std::int64_t context) const {
  constexpr std::int64_t kUnbounded = std::int64_t{1} << 62;
  const auto c = static_cast<double>(context);
  // n tokens add w_seqs + w_kv (c + n) + w_tokens n, and for n > 1 also w_attn n (c + n):
  // a n^2 + b n + k <= headroom.
  const double k = w_[2] + w_[3] * c, b1 = w_[1] + w_[3];
  if (headroom < k + b1) return 0;  // not even one token
  const double a = w_[4], b = b1 + w_[4] * c, room = headroom - k;
  double n = 0;
  if (a > 0) {
    n = std::floor((-b + std::sqrt(b * b + 4 * a * room)) / (2 * a));
  } else if (b > 0) {
    n = std::floor(room / b);
  } else {
    return kUnbounded;
  }
  if (n >= static_cast<double>(kUnbounded)) return kUnbounded;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(n));
}

}  // namespace lmserve::engine
