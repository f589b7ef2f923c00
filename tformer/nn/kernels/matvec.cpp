// Weights times a few rows of activations, the time of a decoding step: out (N, out) = x (N, in) times the weight
// (out, in), float32 or bfloat16 (tformer/nn/weights/prepacked.py; the activations in the weight's type) or int8
// with one scale per output row (tformer/nn/weights/int8.py, the "compiled" way; float32 activations). One row (or
// a beam's few) meets every weight once, so the time is the weight's bytes read: each weight row is read once per
// four input rows (two without AVX-512), bfloat16 and int8 converted to floats in registers, every sum in float32
// (bfloat16 outputs rounded once, at the end, as PyTorch's bfloat16 product rounds them).
//
// Which weight rows a thread reads together differs by weight type. Int8 rows are read four neighbours at a time,
// the next four prefetched a cache line an iteration while these are multiplied: the hardware's own prefetcher,
// seeing four short streams, fetched too late (2.4x slower over GPT-2's weights, measured here). Float32 rows are
// read two at a time from the two halves of the thread's share: two long streams that the hardware prefetcher
// follows, 1.3-1.8x the bytes per second of four neighbouring rows on the tall weights of a Llama-3.2-1B shape
// (fused gate/up, output head) and the same on the wide one (a /tmp microbenchmark on the AMD EPYC host, two threads).
// Bfloat16 rows are read four at a time, from the four quarters of the thread's share (half the bytes a row: four
// streams keep as many bytes in flight as float32's two): over a Qwen2.5-0.5B shape's weights, 1.09-1.14x the batched
// product's bytes per second against 0.83-1.06x with two streams (benchmarks/matvec_bandwidth.py --dtype bf16, three
// runs each on the Intel Xeon with AMX, two threads).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512F__)
inline __m512 load16(const float* weight) { return _mm512_loadu_ps(weight); }
inline __m512 load16(const int8_t* weight) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(weight))));
}
inline __m512 load16(const at::BFloat16* weight) {  // a bfloat16 is a float32's upper half
  const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(weight));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}
#endif
#if defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const float* weight) { return _mm256_loadu_ps(weight); }
inline __m256 load8(const int8_t* weight) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(weight))));
}
inline __m256 load8(const at::BFloat16* weight) {
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(weight));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}
#endif

// How a thread walks its share of the weight's rows (see the file's head).
struct Walk {
  int64_t stride;  // between the weight rows of one block: 1 (neighbours) or the share's length / OUTS
  bool prefetch;   // fetch the next block's rows while this one's are multiplied (neighbouring blocks only)
};

// Weight rows o, o + stride, ..., o + (OUTS - 1) * stride against ROWS input rows: ROWS x OUTS independent sums
// (one running sum would make every product wait for the last addition), sixteen inputs at a time in AVX-512
// registers, then eight in AVX2 ones, where the machine has them, the rest one by one. Each output is its sum
// times its row's scale (int8; none for float32) plus its bias (where given).
template <typename Weight, int ROWS, int OUTS>
void multiply_block(const float* x, const Weight* weight, const float* scales, const float* bias, float* out,
                    int64_t inputs, int64_t outputs, int64_t o, Walk walk) {
  const Weight* rows[OUTS];
  for (int k = 0; k < OUTS; ++k) rows[k] = weight + (o + k * walk.stride) * inputs;
  const Weight* next_block = weight + (o + OUTS) * inputs;
  float sums[ROWS][OUTS] = {};
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 wide_sums[ROWS][OUTS];
  for (int r = 0; r < ROWS; ++r)
    for (int k = 0; k < OUTS; ++k) wide_sums[r][k] = _mm512_setzero_ps();
  for (; i + 16 <= inputs; i += 16) {
    if (walk.prefetch) _mm_prefetch(reinterpret_cast<const char*>(next_block + i * OUTS), _MM_HINT_T0);
    __m512 weights[OUTS];
    for (int k = 0; k < OUTS; ++k) weights[k] = load16(rows[k] + i);
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
  for (; i + 8 <= inputs; i += 8) {
    if (walk.prefetch) _mm_prefetch(reinterpret_cast<const char*>(next_block + i * OUTS), _MM_HINT_T0);
    __m256 weights[OUTS];
    for (int k = 0; k < OUTS; ++k) weights[k] = load8(rows[k] + i);
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
      for (int k = 0; k < OUTS; ++k) sums[r][k] += x[r * inputs + i] * static_cast<float>(rows[k][i]);
  for (int k = 0; k < OUTS; ++k) {
    const int64_t row = o + k * walk.stride;
    const float scale = scales ? scales[row] : 1.0f, shift = bias ? bias[row] : 0.0f;
    for (int r = 0; r < ROWS; ++r) out[r * outputs + row] = sums[r][k] * scale + shift;
  }
}

// ROWS input rows against weight rows [first, last): OUTS at a time as ``strided`` says (see the file's head), the
// rows left over one by one.
template <typename Weight, int ROWS, int OUTS>
void multiply_rows(const float* x, const Weight* weight, const float* scales, const float* bias, float* out,
                   int64_t inputs, int64_t outputs, int64_t first, int64_t last, bool strided) {
  int64_t o = first;
  if (strided) {
    const int64_t share = (last - first) / OUTS;
    for (; o < first + share; ++o)
      multiply_block<Weight, ROWS, OUTS>(x, weight, scales, bias, out, inputs, outputs, o, Walk{share, false});
    o = first + share * OUTS;
  } else {
    for (; o + OUTS <= last; o += OUTS)
      multiply_block<Weight, ROWS, OUTS>(x, weight, scales, bias, out, inputs, outputs, o, Walk{1, true});
  }
  for (; o < last; ++o)
    multiply_block<Weight, ROWS, 1>(x, weight, scales, bias, out, inputs, outputs, o, Walk{1, !strided});
}

// x (N, in) times weight (out, in) -> (N, out): threads split the weight's rows (each reads its own part of the
// weight once; 64 rows a grain at least), input rows four (AVX-512) or two at a time.
template <typename Weight, int OUTS>
torch::Tensor multiply(const torch::Tensor& x, const torch::Tensor& weight, const float* scales, const float* bias,
                       bool strided) {
  const int64_t rows = x.size(0), inputs = x.size(1), outputs = weight.size(0);
  auto out = torch::empty({rows, outputs}, x.options());
  const float* source = x.data_ptr<float>();
  const Weight* values = weight.data_ptr<Weight>();
  float* target = out.data_ptr<float>();
  at::parallel_for(0, outputs, 64, [&](int64_t first, int64_t last) {
    int64_t done = 0;
#if defined(__AVX512F__)  // 32 vector registers: four input rows' sums for four weight rows fit in them
    for (; done + 4 <= rows; done += 4)
      multiply_rows<Weight, 4, OUTS>(source + done * inputs, values, scales, bias, target + done * outputs, inputs,
                                     outputs, first, last, strided);
#endif
    for (; done + 2 <= rows; done += 2)
      multiply_rows<Weight, 2, OUTS>(source + done * inputs, values, scales, bias, target + done * outputs, inputs,
                                     outputs, first, last, strided);
    for (; done < rows; ++done)
      multiply_rows<Weight, 1, OUTS>(source + done * inputs, values, scales, bias, target + done * outputs, inputs,
                                     outputs, first, last, strided);
  });
  return out;
}

void check_rows(const char* name, const torch::Tensor& x, const torch::Tensor& weight, at::ScalarType x_type) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && weight.size(1) == x.size(1), name,
              ": x (N, in) and weight (out, in)");
  TORCH_CHECK(x.scalar_type() == x_type && x.is_contiguous() && weight.is_contiguous(), name,
              ": x in ", x_type, ", contiguous tensors only");
}

}  // namespace

// x (N, in) float32, weight (out, in) int8, scales (out,) float32 -> (N, out) float32.
torch::Tensor int8_matvec(torch::Tensor x, torch::Tensor weight, torch::Tensor scales) {
  check_rows("int8_matvec", x, weight, at::kFloat);
  TORCH_CHECK(weight.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat && scales.dim() == 1 &&
              scales.is_contiguous() && scales.size(0) == weight.size(0),
              "int8_matvec: int8 weight (out, in), float32 scales (out,)");
  return multiply<int8_t, 4>(x, weight, scales.data_ptr<float>(), nullptr, false);
}

// x (N, in) and weight (out, in) both float32 or both bfloat16, bias (out,) float32 or empty (none) -> (N, out) in
// the weight's type.
torch::Tensor float_matvec(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
  const at::ScalarType type = weight.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kBFloat16, "float_matvec: float32 or bfloat16 weight");
  check_rows("float_matvec", x, weight, type);
  const bool has_bias = bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.scalar_type() == at::kFloat && bias.dim() == 1 && bias.is_contiguous() &&
                            bias.size(0) == weight.size(0)),
              "float_matvec: float32 bias (out,) or none");
  const float* shifts = has_bias ? bias.data_ptr<float>() : nullptr;
  if (type == at::kFloat) return multiply<float, 2>(x, weight, nullptr, shifts, true);
  return multiply<at::BFloat16, 4>(x.to(at::kFloat), weight, nullptr, shifts, true).to(at::kBFloat16);
}
