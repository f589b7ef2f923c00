// Dynamic int8 activations (tformer/nn/weights/int8.py, w8a8's "dynamic" way): the two passes around the integer
// matrix product. Each row of activations is rounded to int8 with its own step (max |x| of the row / 127), and the
// product's int32 sums are scaled back to floats (times the row's step, times the weight row's scale, plus the
// bias). As tensor operations these are five and four passes over the activations (absolute value, maximum,
// division, rounding, conversion; conversion, two products, the bias); here a row is read twice to round it and
// the sums once. The arithmetic is the tensor operations', in their order, so the results are theirs bit for bit.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

float largest_magnitude(const float* row, int64_t length) {
  float largest = 0.0f;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 wide = _mm512_setzero_ps();
  for (; i + 16 <= length; i += 16) wide = _mm512_max_ps(wide, _mm512_abs_ps(_mm512_loadu_ps(row + i)));
  largest = _mm512_reduce_max_ps(wide);
#endif
  for (; i < length; ++i) largest = std::max(largest, std::fabs(row[i]));
  return largest;
}

void round_row(const float* row, float step, int8_t* integers, int64_t length) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 steps = _mm512_set1_ps(step);
  for (; i + 16 <= length; i += 16) {
    const __m512 ratio = _mm512_div_ps(_mm512_loadu_ps(row + i), steps);
    const __m512 rounded = _mm512_roundscale_ps(ratio, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(integers + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(rounded)));
  }
#endif
  for (; i < length; ++i) integers[i] = static_cast<int8_t>(std::nearbyint(row[i] / step));  // ties to even
}

// No fused multiply-add: (sum * step) * scale + bias rounds after each operation, as the tensor operations do.
__attribute__((optimize("fp-contract=off")))
void scale_row(const int32_t* sums, float step, const float* scales, const float* bias, float* out, int64_t length) {
  int64_t o = 0;
#if defined(__AVX512F__)
  const __m512 steps = _mm512_set1_ps(step);
  for (; o + 16 <= length; o += 16) {
    __m512 value = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(sums + o)), steps);
    value = _mm512_mul_ps(value, _mm512_loadu_ps(scales + o));
    if (bias != nullptr) value = _mm512_add_ps(value, _mm512_loadu_ps(bias + o));
    _mm512_storeu_ps(out + o, value);
  }
#endif
  for (; o < length; ++o) {
    float value = static_cast<float>(sums[o]) * step;
    value = value * scales[o];
    out[o] = bias != nullptr ? value + bias[o] : value;
  }
}

}  // namespace

// x (N, in) float32 -> [integers (N, in) int8, steps (N, 1) float32]: each row over its own step, max |x| / 127
// (at least the smallest normal float, for a row of zeros), rounded to the nearest integer, ties to even.
std::vector<torch::Tensor> int8_round_rows(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "int8_round_rows: x must be (N, in) float32, contiguous");
  const int64_t rows = x.size(0), length = x.size(1);
  auto integers = torch::empty({rows, length}, x.options().dtype(at::kChar));
  auto steps = torch::empty({rows, 1}, x.options());
  const float* source = x.data_ptr<float>();
  int8_t* target = integers.data_ptr<int8_t>();
  float* row_steps = steps.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float step = std::max(largest_magnitude(source + r * length, length) / 127.0f, FLT_MIN);
      row_steps[r] = step;
      round_row(source + r * length, step, target + r * length, length);
    }
  });
  return {integers, steps};
}

// sums (N, out) int32, steps (N, 1), scales (out,), bias (out,) or empty (no bias), float32 -> (N, out) float32:
// (sums * steps) * scales + bias.
torch::Tensor int8_scale_sums(torch::Tensor sums, torch::Tensor steps, torch::Tensor scales, torch::Tensor bias) {
  TORCH_CHECK(sums.dim() == 2 && sums.scalar_type() == at::kInt && sums.is_contiguous(),
              "int8_scale_sums: sums must be (N, out) int32, contiguous");
  const int64_t rows = sums.size(0), outputs = sums.size(1);
  TORCH_CHECK(steps.numel() == rows && steps.scalar_type() == at::kFloat && steps.is_contiguous(),
              "int8_scale_sums: steps must be N float32 values");
  TORCH_CHECK(scales.numel() == outputs && scales.scalar_type() == at::kFloat && scales.is_contiguous(),
              "int8_scale_sums: scales must be (out,) float32");
  TORCH_CHECK(bias.numel() == 0 || (bias.numel() == outputs && bias.scalar_type() == at::kFloat && bias.is_contiguous()),
              "int8_scale_sums: bias must be (out,) float32 or empty");
  auto out = torch::empty({rows, outputs}, scales.options());
  const int32_t* source = sums.data_ptr<int32_t>();
  const float* row_steps = steps.data_ptr<float>();
  const float* factors = scales.data_ptr<float>();
  const float* offsets = bias.numel() ? bias.data_ptr<float>() : nullptr;
  float* target = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      scale_row(source + r * outputs, row_steps[r], factors, offsets, target + r * outputs, outputs);
  });
  return out;
}
