// Shared by the backend comparison tests: random inputs, dtype rounding, error measures.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/device/devices.h"
#include "backend/dtypes.h"
#include "common/numeric.h"

namespace lmserve::compare {

// act codes of cuda_ops.h
using Act = backend::ActDtype;
inline constexpr Act kF32 = Act::kFloat32, kBF16 = Act::kBFloat16, kF16 = Act::kFloat16;

inline const char* act_name(Act a) { return a == kF32 ? "float32" : (a == kBF16 ? "bfloat16" : "float16"); }

// The relative L2 bound each act dtype is held to.
inline double tolerance(Act act) { return act == kF32 ? 1e-5 : 1e-2; }

inline float round_to(Act act, float v) {
  if (act == kBF16) return bf16_to_float(float_to_bf16(v));
  if (act == kF16) return f16_to_float(float_to_f16(v));
  return v;
}

inline std::vector<float> rounded(Act act, std::vector<float> v) {
  for (float& x : v) x = round_to(act, x);
  return v;
}

// Uniform in [lo, hi), never all zeros.
inline std::vector<float> random_vec(std::mt19937& rng, std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ||a - b|| / ||b||; infinite if any element of a is not finite (an unwritten, poisoned one).
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Skips the test (with the reason) where no GPU can run it.
#define LMSERVE_REQUIRE_GPU()                                                           \
  do {                                                                                  \
    auto probe_ = ::lmserve::probe_devices();                                           \
    if (probe_.devices.empty()) GTEST_SKIP() << "no GPU: " << probe_.reason;            \
  } while (0)

}  // namespace lmserve::compare
