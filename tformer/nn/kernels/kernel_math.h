// Arithmetic the compiled kernels share (tformer/nn/compiled.py builds them).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tformer {

// exp(x) in arithmetic a loop vectorises (glibc's expf is a call per element, and std::floor does not
// vectorise here): x = n ln 2 + r with |r| <= ln 2 / 2 (n rounded by adding and taking away 1.5 * 2^23;
// ln 2 in two parts, after Cody and Waite), e^r by Cephes' degree-6 polynomial (about 1 ulp), 2^n written
// into the exponent bits. x is clamped to [-87, 88]: below, it gives e^-87 (1.6e-38), not 0, which is
// nothing beside the 1 that the largest term is when callers subtract the max first, as both kernels do.
inline float vector_exp(float x) {
  const float low = x > -87.0f ? x : -87.0f;
  const float clamped = low < 88.0f ? low : 88.0f;
  const float n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float power;
  std::memcpy(&power, &bits, sizeof power);
  return e * power;
}

inline double vector_exp(double x) { return std::exp(x); }

}  // namespace tformer
