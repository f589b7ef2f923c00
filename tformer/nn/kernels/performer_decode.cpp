// One causal Performer decoding step in one pass (tformer/nn/favor.py's decode_one, for the CPU).
//
// Per (sequence, key/value head): the key's and the queries' random-feature logits, the running max,
// the carried sums brought to it when it rises, phi(k)^T [v, 1] added, and every query head's output
// read from the updated sums: the state is read and written once, where decode_one's tensor operations
// pass over it three times and call some twenty operators.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "kernel_math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// A (B, heads, 1, D) tensor's element (b, h, 0, d), at any strides (a head split's view is not contiguous).
struct Rows {
  const void* data;
  int64_t batch_stride, head_stride, dim_stride;
};

template <typename scalar_t>
inline scalar_t at(const Rows& rows, int64_t b, int64_t h, int64_t d) {
  return static_cast<const scalar_t*>(rows.data)[b * rows.batch_stride + h * rows.head_stride + d * rows.dim_stride];
}

template <typename scalar_t>
void performer_rows(const Rows& queries, const Rows& keys, const Rows& values, const scalar_t* weights,
                    scalar_t* sums, const scalar_t* level, scalar_t* new_level, scalar_t* out, int64_t batch,
                    int64_t kv_heads, int64_t group, int64_t head_dim, int64_t width, int64_t features, double scale) {
  const int64_t stride = width + 1;  // a sums row: the state's Dv values, then the normaliser
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<scalar_t> key_features(features), query_features(group * features), total(group * stride),
        value(width);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / kv_heads, kv_head = row % kv_heads;
      // Logits: x W (W already times scale**0.5), for the key and each query head of this row.
      std::fill(key_features.begin(), key_features.end(), scalar_t(0));
      std::fill(query_features.begin(), query_features.end(), scalar_t(0));
      scalar_t key_norm = 0;
      for (int64_t d = 0; d < head_dim; ++d) {
        const scalar_t* w = weights + d * features;
        const scalar_t kd = at<scalar_t>(keys, b, kv_head, d);
        key_norm += kd * kd;
        scalar_t* kf = key_features.data();
#pragma omp simd
        for (int64_t m = 0; m < features; ++m) kf[m] += kd * w[m];
        for (int64_t g = 0; g < group; ++g) {
          const scalar_t qd = at<scalar_t>(queries, b, kv_head * group + g, d);
          scalar_t* qf = query_features.data() + g * features;
#pragma omp simd
          for (int64_t m = 0; m < features; ++m) qf[m] += qd * w[m];
        }
      }
      // Key features relative to the running max: exp(k'w - |k'|^2 / 2 - max), each <= 1.
      const scalar_t half_norm = key_norm * static_cast<scalar_t>(scale) / 2;
      scalar_t largest = -std::numeric_limits<scalar_t>::infinity();
      scalar_t* kf = key_features.data();
#pragma omp simd reduction(max : largest)
      for (int64_t m = 0; m < features; ++m) {
        kf[m] -= half_norm;
        largest = kf[m] > largest ? kf[m] : largest;
      }
      const scalar_t previous = level[row], raised = std::max(previous, largest);
      const scalar_t carry = raised > previous ? std::exp(previous - raised) : scalar_t(1);
#pragma omp simd
      for (int64_t m = 0; m < features; ++m) kf[m] = tformer::vector_exp(kf[m] - raised);
      // Query features relative to each query's own max (a factor that cancels in the ratio).
      for (int64_t g = 0; g < group; ++g) {
        scalar_t* qf = query_features.data() + g * features;
        scalar_t top = -std::numeric_limits<scalar_t>::infinity();
#pragma omp simd reduction(max : top)
        for (int64_t m = 0; m < features; ++m) top = qf[m] > top ? qf[m] : top;
#pragma omp simd
        for (int64_t m = 0; m < features; ++m) qf[m] = tformer::vector_exp(qf[m] - top);
      }
      for (int64_t j = 0; j < width; ++j) value[j] = at<scalar_t>(values, b, kv_head, j);
      // One pass over the sums: update each feature's row, then read it into every query's output.
      scalar_t* state = sums + row * features * stride;
      std::fill(total.begin(), total.end(), scalar_t(0));
      const scalar_t* v = value.data();
      for (int64_t m = 0; m < features; ++m) {
        scalar_t* line = state + m * stride;
        const scalar_t feature = kf[m];
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) line[j] = line[j] * carry + feature * v[j];
        line[width] = line[width] * carry + feature;
        for (int64_t g = 0; g < group; ++g) {
          const scalar_t qf = query_features[g * features + m];
          scalar_t* acc = total.data() + g * stride;
#pragma omp simd
          for (int64_t j = 0; j < stride; ++j) acc[j] += qf * line[j];
        }
      }
      const scalar_t tiny = std::numeric_limits<scalar_t>::min();
      for (int64_t g = 0; g < group; ++g) {
        const scalar_t* acc = total.data() + g * stride;
        const scalar_t inverse = scalar_t(1) / std::max(acc[width], tiny);
        scalar_t* target = out + (b * kv_heads * group + kv_head * group + g) * width;
        for (int64_t j = 0; j < width; ++j) target[j] = acc[j] * inverse;
      }
      new_level[row] = raised;
    }
  });
}

Rows rows_of(const torch::Tensor& tensor) {
  return {tensor.data_ptr(), tensor.stride(0), tensor.stride(1), tensor.stride(3)};
}

}  // namespace

// queries (B, H, 1, Dh), keys (B, Hkv, 1, Dh), values (B, Hkv, 1, Dv), any strides, Hkv dividing H; weights
// (Dh, M) the projection times scale**0.5; sums (B, Hkv, M, Dv + 1) updated in place; level (B, Hkv).
// Returns the output (B, H, 1, Dv) and the new level (B, Hkv).
std::vector<torch::Tensor> performer_decode(torch::Tensor queries, torch::Tensor keys, torch::Tensor values,
                                            torch::Tensor weights, torch::Tensor sums, torch::Tensor level,
                                            double scale) {
  TORCH_CHECK(queries.dim() == 4 && keys.dim() == 4 && values.dim() == 4 && weights.dim() == 2 && sums.dim() == 4 &&
                  level.dim() == 2, "performer_decode: queries (B, H, 1, Dh), keys (B, Hkv, 1, Dh), values "
              "(B, Hkv, 1, Dv), weights (Dh, M), sums (B, Hkv, M, Dv + 1), level (B, Hkv)");
  for (const auto& tensor : {queries, keys, values, weights, sums, level}) {
    TORCH_CHECK(tensor.scalar_type() == sums.scalar_type(), "performer_decode: tensors of one dtype");
  }
  TORCH_CHECK(weights.is_contiguous() && sums.is_contiguous() && level.is_contiguous(),
              "performer_decode: contiguous weights, sums and level");
  const int64_t batch = queries.size(0), heads = queries.size(1), head_dim = queries.size(3);
  const int64_t kv_heads = keys.size(1), width = values.size(3), features = weights.size(1);
  TORCH_CHECK(queries.size(2) == 1 && keys.size(2) == 1 && values.size(2) == 1, "performer_decode: one position");
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0 && keys.size(0) == batch && values.size(0) == batch &&
                  values.size(1) == kv_heads && keys.size(3) == head_dim && weights.size(0) == head_dim &&
                  sums.size(0) == batch && sums.size(1) == kv_heads && sums.size(2) == features &&
                  sums.size(3) == width + 1 && level.size(0) == batch && level.size(1) == kv_heads,
              "performer_decode: sizes do not agree");
  auto out = torch::empty({batch, heads, 1, width}, sums.options());
  auto new_level = torch::empty_like(level);
  AT_DISPATCH_FLOATING_TYPES(sums.scalar_type(), "performer_decode", [&] {
    performer_rows<scalar_t>(rows_of(queries), rows_of(keys), rows_of(values), weights.data_ptr<scalar_t>(),
                             sums.data_ptr<scalar_t>(), level.data_ptr<scalar_t>(), new_level.data_ptr<scalar_t>(),
                             out.data_ptr<scalar_t>(), batch, kv_heads, heads / kv_heads, head_dim, width, features,
                             scale);
  });
  return {out, new_level};
}
