// The narrow formats round exactly as CUDA's conversions do: nearest, ties to even;
// FP8 saturating to the largest finite value, NaN kept.
#include "common/numeric.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace lmserve {
namespace {

// The representable value nearest to f among all codes (ties: even code), by brute force.
template <typename Decode>
std::uint8_t nearest_code(float f, Decode decode, float max_finite) {
  if (std::fabs(f) > max_finite) return nearest_code(std::copysign(max_finite, f), decode, max_finite);
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    float v = decode(static_cast<std::uint8_t>(c));
    if (std::isnan(v) || std::isinf(v)) continue;
    if (std::signbit(v) != std::signbit(f) && v != 0.0f) continue;
    double err = std::fabs(static_cast<double>(v) - f);
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<std::uint8_t>(best);
}

TEST(Numeric, Fp8RoundTripsEveryCode) {
  for (int c = 0; c < 256; ++c) {
    auto code = static_cast<std::uint8_t>(c);
    float a = fp8_e5m2_to_float(code), b = fp8_e4m3_to_float(code);
    if (!std::isnan(a) && !std::isinf(a)) {
      EXPECT_EQ(float_to_fp8_e5m2(a), code) << c;
    }
    if (!std::isnan(b)) {
      EXPECT_EQ(float_to_fp8_e4m3(b), code) << c;
    }
  }
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e5m2_to_float(0x7b), 57344.0f);
}

TEST(Numeric, Fp8RoundsToNearestEvenAndSaturates) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-24, 18);
  for (int i = 0; i < 20000; ++i) {
    float f = std::ldexp(mant(rng), exp(rng));
    auto e5 = float_to_fp8_e5m2(f), e4 = float_to_fp8_e4m3(f);
    EXPECT_EQ(fp8_e5m2_to_float(e5), fp8_e5m2_to_float(nearest_code(f, fp8_e5m2_to_float, 57344.0f))) << f;
    EXPECT_EQ(fp8_e4m3_to_float(e4), fp8_e4m3_to_float(nearest_code(f, fp8_e4m3_to_float, 448.0f))) << f;
  }
  EXPECT_EQ(fp8_e4m3_to_float(float_to_fp8_e4m3(1e9f)), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(float_to_fp8_e4m3(-INFINITY)), -448.0f);
  EXPECT_EQ(fp8_e5m2_to_float(float_to_fp8_e5m2(INFINITY)), 57344.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(float_to_fp8_e4m3(NAN))));
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(float_to_fp8_e5m2(NAN))));
  // Ties: 1.0625 is halfway between 1.0 (even) and 1.125 in e4m3.
  EXPECT_EQ(fp8_e4m3_to_float(float_to_fp8_e4m3(1.0625f)), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(float_to_fp8_e4m3(1.1875f)), 1.25f);
}

// The bit-level e4m3 encoder against the general rounding (round_to_format, then encode_fp8)
// over every 251st float bit pattern, both signs, NaN and infinities among them.
TEST(Numeric, Fp8E4m3BitsMatchTheGeneralRounding) {
  std::uint64_t checked = 0;
  for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += 251) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    std::uint8_t want;
    if (std::isnan(f)) {
      want = 0x7f;
    } else {
      const float a = std::fabs(f);
      float r = std::isinf(a) ? 448.0f : detail::round_to_format(a, 3, -6);
      if (r > 448.0f) r = 448.0f;
      want = detail::encode_fp8(std::signbit(f), r, 3, 7);
    }
    ASSERT_EQ(float_to_fp8_e4m3(f), want) << std::hex << bits << " " << f;
    ++checked;
  }
  EXPECT_GT(checked, 17000000u);
}

TEST(Numeric, HalfFormatsRoundToNearestEven) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  std::mt19937 rng(2);
  std::uniform_int_distribution<std::uint32_t> any16(0, 0xffff);
  for (int i = 0; i < 20000; ++i) {
    auto h = static_cast<std::uint16_t>(any16(rng));
    float f = f16_to_float(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_f16(f), h) << h;
  }
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 1.0f / 2048)), 1.0f);  // tie -> even
}

}  // namespace
}  // namespace lmserve
