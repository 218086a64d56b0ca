// Scalar conversions between float and the storage formats lmserve uses for weights and KV:
// bfloat16, IEEE float16 and the two FP8 formats. float -> narrow rounds to nearest, ties to
// even; FP8 saturates to the largest finite value as CUDA's __nv_cvt_float_to_fp8(...,
// __NV_SATFINITE, ...) does (NaN stays NaN), so the CPU reference and the GPU store the same
// bytes.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace lmserve {

inline float bf16_to_float(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float f16_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return std::bit_cast<float>(sign);
    float v = std::ldexp(static_cast<float>(man), -24);  // subnormal
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

namespace detail {

// Rounds |f| (finite, non-negative) to a float with `man_bits` mantissa bits and minimum
// normal exponent `min_exp` (subnormals below), nearest-even. Returns the rounded value.
inline float round_to_format(float a, int man_bits, int min_exp) {
  if (a == 0.0f) return 0.0f;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = std::max(e - 1, min_exp);
  float quantum = std::ldexp(1.0f, exp - man_bits);
  return std::nearbyint(a / quantum) * quantum;  // default rounding mode: nearest-even
}

// Encodes a value already representable in the format (sign, exponent bias, mantissa bits).
inline std::uint8_t encode_fp8(bool neg, float a, int man_bits, int bias) {
  std::uint8_t sign = neg ? 0x80 : 0;
  if (a == 0.0f) return sign;
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e
  int exp = e - 1 + bias;
  if (exp <= 0) {  // subnormal: a = man * 2^(1 - bias - man_bits)
    int man = static_cast<int>(std::ldexp(a, bias - 1 + man_bits));
    return static_cast<std::uint8_t>(sign | man);
  }
  int man = static_cast<int>((m * 2.0f - 1.0f) * static_cast<float>(1 << man_bits));
  return static_cast<std::uint8_t>(sign | (exp << man_bits) | man);
}

}  // namespace detail

inline std::uint16_t float_to_f16(float f) {
  std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return 0x7e00;
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;  // overflows to infinity, as IEEE conversion does
  float r = detail::round_to_format(a, 10, -14);
  if (r == 0.0f) return sign;
  if (r >= 65536.0f) return sign | 0x7c00;
  int e;
  float m = std::frexp(r, &e);
  int exp = e - 1 + 15;
  if (exp <= 0) return static_cast<std::uint16_t>(sign | static_cast<int>(std::ldexp(r, 24)));
  return static_cast<std::uint16_t>(sign | (exp << 10) | static_cast<int>((m * 2.0f - 1.0f) * 1024.0f));
}

// FP8 E5M2: bias 15, 2 mantissa bits, has infinities; largest finite 57344.
inline std::uint8_t float_to_fp8_e5m2(float f) {
  if (std::isnan(f)) return 0x7f;
  bool neg = std::signbit(f);
  float a = std::fabs(f);
  float r = std::isinf(a) ? 57344.0f : detail::round_to_format(a, 2, -14);
  if (r > 57344.0f) r = 57344.0f;  // saturate
  return detail::encode_fp8(neg, r, 2, 15);
}

inline float fp8_e5m2_to_float(std::uint8_t v) {
  return f16_to_float(static_cast<std::uint16_t>(v) << 8);
}

// FP8 E4M3 (the "FN" variant): bias 7, 3 mantissa bits, no infinities, 0x7f/0xff are NaN;
// largest finite 448.
// On the float's bits (a model's weights are quantized a few billion at a time): normals round
// their 23 mantissa bits to 3 by adding half an ulp (less one, plus the kept lsb: ties to even);
// below 2^-6 the value is a multiple of 2^-9; 448 and above (infinity too) saturate.
inline std::uint8_t float_to_fp8_e4m3(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;                            // NaN
  if (a >= 0x43e00000u) return static_cast<std::uint8_t>(sign | 0x7e);  // >= 448: 448
  if (a < 0x3c800000u) {                                       // below 2^-6: 0..8 x 2^-9
    const auto q = static_cast<std::uint32_t>(std::nearbyint(std::bit_cast<float>(a) * 512.0f));
    return static_cast<std::uint8_t>(sign | q);
  }
  const std::uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) & ~0xfffffu;
  const std::uint32_t e = (r >> 23) - 120, m = (r >> 20) & 7u;  // e4m3's exponent (bias 7)
  if (e > 15 || (e == 15 && m == 7)) return static_cast<std::uint8_t>(sign | 0x7e);
  return static_cast<std::uint8_t>(sign | (e << 3) | m);
}

inline float fp8_e4m3_to_float(std::uint8_t v) {
  bool neg = v & 0x80;
  int exp = (v >> 3) & 0xf, man = v & 7;
  if (exp == 15 && man == 7) return std::nanf("");
  float a = exp == 0 ? std::ldexp(static_cast<float>(man), -9) : std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return neg ? -a : a;
}

}  // namespace lmserve
