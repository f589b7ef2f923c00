// Arithmetic the compiled kernels share (tformer/nn/compiled.py builds them).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

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

// Softmax numerators of a row of attention scores, in place: exp(score - the row's largest), a hidden key's
// -infinity giving exactly 0. Returns 1 / their sum, or 0 when the row has no visible key (the caller's output
// is then zeros, as every attention kernel gives a query that sees nothing).
template <typename acc_t>
acc_t softmax_numerators(acc_t* scores, int64_t length) {
  const acc_t hidden = -std::numeric_limits<acc_t>::infinity();
  acc_t largest = hidden;
  for (int64_t j = 0; j < length; ++j) largest = scores[j] > largest ? scores[j] : largest;
  if (largest == hidden) {
    for (int64_t j = 0; j < length; ++j) scores[j] = 0;
    return 0;
  }
  acc_t normaliser = 0;
#pragma omp simd reduction(+ : normaliser)
  for (int64_t j = 0; j < length; ++j) {
    scores[j] = scores[j] == hidden ? acc_t(0) : vector_exp(scores[j] - largest);  // vector_exp clamps -inf
    normaliser += scores[j];
  }
  return acc_t(1) / normaliser;
}

}  // namespace tformer
