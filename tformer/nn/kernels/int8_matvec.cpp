// Weight-only int8 products for a few rows of activations (tformer/nn/weights/int8.py, the "compiled" way):
// out (N, out) = x (N, in) float32 times the int8 weight (out, in) as floats, each output scaled by its row's
// scale. Decoding multiplies one row (or a beam's few) by every weight once: the time is the weight's bytes
// read, so each weight row is read once per four input rows (two without AVX-512), converted to floats in registers.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// Weight rows o .. o + OUTS - 1 against ROWS input rows, ROWS x OUTS independent sums (one running sum would
// make every product wait for the last addition): sixteen inputs at a time in AVX-512 registers, then eight in
// AVX2 ones, where the machine has them, the rest one by one.
template <int ROWS, int OUTS>
void multiply_block(const float* x, const int8_t* weight, const float* scales, float* out, int64_t inputs,
                    int64_t outputs, int64_t o) {
  float sums[ROWS][OUTS] = {};
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 wide_sums[ROWS][OUTS];
  for (int r = 0; r < ROWS; ++r)
    for (int k = 0; k < OUTS; ++k) wide_sums[r][k] = _mm512_setzero_ps();
  // The rows after these, fetched a cache line an iteration while these are multiplied: the hardware's own
  // prefetcher, seeing four short streams, fetched too late (2.4x slower over GPT-2's weights, measured here).
  const int8_t* next_block = weight + (o + OUTS) * inputs;
  for (; i + 16 <= inputs; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(next_block + i * OUTS), _MM_HINT_T0);
    __m512 weights[OUTS];
    for (int k = 0; k < OUTS; ++k) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(weight + (o + k) * inputs + i));
      weights[k] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
    }
    for (int r = 0; r < ROWS; ++r) {
      const __m512 values = _mm512_loadu_ps(x + r * inputs + i);
      for (int k = 0; k < OUTS; ++k) wide_sums[r][k] = _mm512_fmadd_ps(values, weights[k], wide_sums[r][k]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int k = 0; k < OUTS; ++k) sums[r][k] = _mm512_reduce_add_ps(wide_sums[r][k]);
#endif
#if defined(__AVX2__) && defined(__FMA__)
  __m256 vector_sums[ROWS][OUTS];
  for (int r = 0; r < ROWS; ++r)
    for (int k = 0; k < OUTS; ++k) vector_sums[r][k] = _mm256_setzero_ps();
  const int8_t* following = weight + (o + OUTS) * inputs;
  for (; i + 8 <= inputs; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(following + i * OUTS), _MM_HINT_T0);
    __m256 weights[OUTS];
    for (int k = 0; k < OUTS; ++k) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(weight + (o + k) * inputs + i));
      weights[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    }
    for (int r = 0; r < ROWS; ++r) {
      const __m256 values = _mm256_loadu_ps(x + r * inputs + i);
      for (int k = 0; k < OUTS; ++k) vector_sums[r][k] = _mm256_fmadd_ps(values, weights[k], vector_sums[r][k]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int k = 0; k < OUTS; ++k) {
      const __m128 half = _mm_add_ps(_mm256_castps256_ps128(vector_sums[r][k]),
                                     _mm256_extractf128_ps(vector_sums[r][k], 1));
      const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
      sums[r][k] += _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
    }
#endif
  for (; i < inputs; ++i)
    for (int r = 0; r < ROWS; ++r)
      for (int k = 0; k < OUTS; ++k) sums[r][k] += x[r * inputs + i] * static_cast<float>(weight[(o + k) * inputs + i]);
  for (int r = 0; r < ROWS; ++r)
    for (int k = 0; k < OUTS; ++k) out[r * outputs + o + k] = sums[r][k] * scales[o + k];
}

// ROWS input rows against weight rows [first, last), four at a time.
template <int ROWS>
void multiply_rows(const float* x, const int8_t* weight, const float* scales, float* out, int64_t inputs,
                   int64_t outputs, int64_t first, int64_t last) {
  int64_t o = first;
  for (; o + 4 <= last; o += 4) multiply_block<ROWS, 4>(x, weight, scales, out, inputs, outputs, o);
  for (; o < last; ++o) multiply_block<ROWS, 1>(x, weight, scales, out, inputs, outputs, o);
}

}  // namespace

// x (N, in) float32, weight (out, in) int8, scales (out,) float32 -> (N, out) float32.
torch::Tensor int8_matvec(torch::Tensor x, torch::Tensor weight, torch::Tensor scales) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && scales.dim() == 1, "int8_matvec: x (N, in), weight (out, in), scales (out,)");
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat,
              "int8_matvec: float32 x and scales, int8 weight");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous() && scales.is_contiguous(), "int8_matvec: contiguous tensors only");
  const int64_t rows = x.size(0), inputs = x.size(1), outputs = weight.size(0);
  TORCH_CHECK(weight.size(1) == inputs && scales.size(0) == outputs, "int8_matvec: shapes do not match");
  auto out = torch::empty({rows, outputs}, x.options());
  const float* source = x.data_ptr<float>();
  const int8_t* integers = weight.data_ptr<int8_t>();
  const float* factors = scales.data_ptr<float>();
  float* target = out.data_ptr<float>();
  // Threads split the weight's rows (each reads its own part of the weight once); 64 rows a grain at least.
  at::parallel_for(0, outputs, 64, [&](int64_t first, int64_t last) {
    int64_t done = 0;
#if defined(__AVX512F__)  // 32 vector registers: four input rows' sums for four weight rows fit in them
    for (; done + 4 <= rows; done += 4)
      multiply_rows<4>(source + done * inputs, integers, factors, target + done * outputs, inputs, outputs, first, last);
#endif
    for (; done + 2 <= rows; done += 2)
      multiply_rows<2>(source + done * inputs, integers, factors, target + done * outputs, inputs, outputs, first, last);
    for (; done < rows; ++done)
      multiply_rows<1>(source + done * inputs, integers, factors, target + done * outputs, inputs, outputs, first, last);
  });
  return out;
}
