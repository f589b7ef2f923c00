// Decode attention over a dense key/value cache (tformer/nn/attention/sdpa.py, its one-query step on the CPU).
//
// A decoding step has one query per head and sequence; the keys and values of each (sequence, key/value head)
// sit in the cache as one block of positions x head size. PyTorch's fused attention, made for blocks of queries,
// spends more on its tiling than on the arithmetic when each block holds one query (beam search runs hundreds of
// sequences a step). Here each (sequence, key/value head) reads its keys once for every query head of its group,
// then its values once: softmax(q k^T * scale + mask) v, the mask an additive one (0 for a visible key, the most
// negative float for a hidden one: hidden keys are left out; a position bias is added as it is).

#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include "kernel_math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

struct Strides {
  int64_t batch, head, position;  // of a (B, H, T, Dh) tensor; the head size's stride is 1
};

// One sequence's key/value head: its `group` query heads over `length` positions.
template <typename scalar_t>
void decode_head(const scalar_t* queries, const scalar_t* keys, const scalar_t* values, int64_t key_stride,
                 int64_t value_stride, const scalar_t* mask, int64_t mask_head_stride, int64_t mask_key_stride,
                 scalar_t* out, int64_t group, int64_t length, int64_t head_dim, double scale,
                 std::vector<at::opmath_type<scalar_t>>& scores, std::vector<at::opmath_type<scalar_t>>& total) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t hidden = static_cast<acc_t>(std::numeric_limits<scalar_t>::lowest()) / 2;  // at or below: masked
  scores.resize(group * length);
  total.assign(group * head_dim, acc_t(0));
  // A short block (beam search: tens of positions) is read before the hardware's prefetcher, starting afresh
  // at every block, catches up: fetch a few keys ahead, and each position's value for the pass after, so the two
  // streams read as one. A long block streams well on its own (and its values would leave the cache again).
  const int64_t row_bytes = head_dim * static_cast<int64_t>(sizeof(scalar_t));
  const bool short_block = length * row_bytes <= 16384;
  for (int64_t j = 0; j < length; ++j) {
    const scalar_t* key = keys + j * key_stride;
    if (short_block) {
      const char* ahead = reinterpret_cast<const char*>(keys + std::min(j + 4, length - 1) * key_stride);
      const char* value_row = reinterpret_cast<const char*>(values + j * value_stride);
      for (int64_t byte = 0; byte < row_bytes; byte += 64) {
        __builtin_prefetch(ahead + byte);
        __builtin_prefetch(value_row + byte);
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      const scalar_t* query = queries + g * head_dim;
      acc_t dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < head_dim; ++d) dot += static_cast<acc_t>(query[d]) * static_cast<acc_t>(key[d]);
      acc_t score = dot * static_cast<acc_t>(scale);
      if (mask != nullptr) {
        const acc_t added = static_cast<acc_t>(mask[g * mask_head_stride + j * mask_key_stride]);
        score = added <= hidden ? -std::numeric_limits<acc_t>::infinity() : score + added;
      }
      scores[g * length + j] = score;
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    acc_t* weights = scores.data() + g * length;
    const acc_t inverse = tformer::softmax_numerators(weights, length);  // 0 when every key is hidden: zeros out
    for (int64_t j = 0; j < length; ++j) weights[j] *= inverse;
  }
  for (int64_t j = 0; j < length; ++j) {
    const scalar_t* value = values + j * value_stride;
    for (int64_t g = 0; g < group; ++g) {
      const acc_t weight = scores[g * length + j];
      acc_t* sum = total.data() + g * head_dim;
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) sum[d] += weight * static_cast<acc_t>(value[d]);
    }
  }
  for (int64_t g = 0; g < group; ++g)
    for (int64_t d = 0; d < head_dim; ++d) out[g * head_dim + d] = static_cast<scalar_t>(total[g * head_dim + d]);
}

Strides strides_of(const torch::Tensor& tensor) {
  return {tensor.stride(0), tensor.stride(1), tensor.stride(2)};
}

}  // namespace

// queries (B, H, 1, Dh); keys and values (B, Hkv, T, Dh), Hkv dividing H, any strides but a head size's of 1 (a
// cache's filled part); mask: empty (none) or additive (B | 1, H | 1, 1, T). Returns (B, H, 1, Dh).
torch::Tensor dense_decode(torch::Tensor queries, torch::Tensor keys, torch::Tensor values, torch::Tensor mask,
                           double scale) {
  TORCH_CHECK(queries.dim() == 4 && queries.size(2) == 1 && keys.dim() == 4 && keys.sizes() == values.sizes(),
              "dense_decode: queries (B, H, 1, Dh), keys and values (B, Hkv, T, Dh)");
  TORCH_CHECK(queries.scalar_type() == keys.scalar_type() && keys.scalar_type() == values.scalar_type(),
              "dense_decode: queries, keys and values of one dtype");
  TORCH_CHECK(keys.stride(3) == 1 && values.stride(3) == 1, "dense_decode: keys and values with unit head-size stride");
  const int64_t batch = queries.size(0), heads = queries.size(1), head_dim = queries.size(3);
  const int64_t kv_heads = keys.size(1), length = keys.size(2);
  TORCH_CHECK(keys.size(0) == batch && keys.size(3) == head_dim && kv_heads > 0 && heads % kv_heads == 0,
              "dense_decode: key/value heads must divide query heads, batch and head sizes equal");
  const bool masked = mask.numel() > 0;
  if (masked) {
    TORCH_CHECK(mask.dim() == 4 && mask.scalar_type() == queries.scalar_type() && mask.size(2) == 1 &&
                    mask.size(3) == length && (mask.size(0) == 1 || mask.size(0) == batch) &&
                    (mask.size(1) == 1 || mask.size(1) == heads),
                "dense_decode: mask (B | 1, H | 1, 1, T) in the queries' dtype");
  }
  auto query_rows = queries.contiguous();
  auto out = torch::empty_like(query_rows);
  const int64_t group = heads / kv_heads;
  const Strides key_strides = strides_of(keys), value_strides = strides_of(values);
  const int64_t mask_batch = masked && mask.size(0) > 1 ? mask.stride(0) : 0;
  const int64_t mask_head = masked && mask.size(1) > 1 ? mask.stride(1) : 0;
  const int64_t mask_key = masked ? mask.stride(3) : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, queries.scalar_type(), "dense_decode", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* q = query_rows.data_ptr<scalar_t>();
    const scalar_t* k = keys.data_ptr<scalar_t>();
    const scalar_t* v = values.data_ptr<scalar_t>();
    const scalar_t* m = masked ? mask.data_ptr<scalar_t>() : nullptr;
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> scores, total;  // a thread's buffers, reused from head to head
      for (int64_t item = begin; item < end; ++item) {
        const int64_t b = item / kv_heads, h = item % kv_heads, first = h * group;  // first query head served
        decode_head<scalar_t>(q + (b * heads + first) * head_dim, k + b * key_strides.batch + h * key_strides.head,
                              v + b * value_strides.batch + h * value_strides.head, key_strides.position,
                              value_strides.position, m == nullptr ? nullptr : m + b * mask_batch + first * mask_head,
                              mask_head, mask_key, o + (b * heads + first) * head_dim, group, length, head_dim, scale,
                              scores, total);
      }
    });
  });
  return out;
}
