// Decode attention that reads a paged key/value pool in place (tformer/nn/attention/paged_kernel.py).
//
// Each decoding sequence has one new query per head; its keys and values sit in the pool's slot rows
// that its block table lists, in position order. Softmax attention of each (sequence, query head) over
// exactly those rows, read where they are: no copy of the contexts into a padded batch, no padding.

#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include "kernel_math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// Attention of one sequence's query heads [kv_first * group, kv_last * group) over its context rows. Each pool
// row holds every key/value head side by side (Hkv * Dh values), so the loops walk the rows once, in order,
// and use every head of the range from each row read: whole cache lines, read front to back.
template <typename scalar_t>
void decode_sequence(const scalar_t* queries, const scalar_t* keys, const scalar_t* values, const int64_t* rows,
                     int64_t length, scalar_t* out, int64_t kv_first, int64_t kv_last, int64_t group,
                     int64_t kv_heads, int64_t head_dim, double scale,
                     std::vector<at::opmath_type<scalar_t>>& scores, std::vector<at::opmath_type<scalar_t>>& total,
                     std::vector<at::opmath_type<scalar_t>>& inverse) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t slot_stride = kv_heads * head_dim;  // one pool row: (Hkv, Dh)
  const int64_t first = kv_first * group, count = (kv_last - kv_first) * group;  // the query heads served
  scores.resize(count * length);  // (heads, length): head h's scores at h * length
  total.assign(count * head_dim, acc_t(0));
  // The rows sit in blocks scattered over a pool far larger than the caches, so each step reads them from
  // memory, where the hardware's prefetcher, starting afresh at every block, leaves the loop waiting: fetch the
  // keys a few rows ahead, and each row's values for the second pass while its keys are read.
  const int64_t head_bytes = count / group * head_dim * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t head_offset = kv_first * head_dim;
  for (int64_t j = 0; j < length; ++j) {
    const scalar_t* row = keys + rows[j] * slot_stride;
    const char* ahead = reinterpret_cast<const char*>(keys + rows[std::min(j + 4, length - 1)] * slot_stride + head_offset);
    const char* value_row = reinterpret_cast<const char*>(values + rows[j] * slot_stride + head_offset);
    for (int64_t byte = 0; byte < head_bytes; byte += 64) {
      __builtin_prefetch(ahead + byte);
      __builtin_prefetch(value_row + byte);
    }
    for (int64_t h = 0; h < count; ++h) {
      const scalar_t* query = queries + (first + h) * head_dim;
      const scalar_t* key = row + ((first + h) / group) * head_dim;
      acc_t dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < head_dim; ++d) dot += static_cast<acc_t>(query[d]) * static_cast<acc_t>(key[d]);
      scores[h * length + j] = dot * static_cast<acc_t>(scale);
    }
  }
  inverse.resize(count);  // 1 / each head's softmax normaliser (0 for a sequence with no keys: zeros out)
  for (int64_t h = 0; h < count; ++h) inverse[h] = tformer::softmax_numerators(scores.data() + h * length, length);
  for (int64_t j = 0; j < length; ++j) {
    const scalar_t* row = values + rows[j] * slot_stride;
    for (int64_t h = 0; h < count; ++h) {
      const scalar_t* value = row + ((first + h) / group) * head_dim;
      const acc_t weight = scores[h * length + j];
      acc_t* sum = total.data() + h * head_dim;
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) sum[d] += weight * static_cast<acc_t>(value[d]);
    }
  }
  for (int64_t h = 0; h < count; ++h) {
    scalar_t* row = out + (first + h) * head_dim;
    const acc_t* sum = total.data() + h * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) row[d] = static_cast<scalar_t>(sum[d] * inverse[h]);
  }
}

// Every sequence, whole (all its heads in one pass over its rows) when there are enough sequences to keep the
// threads busy; otherwise (few sequences, long contexts: batch-1 decoding) one key/value head at a time, so
// the threads share the heads.
template <typename scalar_t>
void decode_rows(const scalar_t* queries, const scalar_t* keys, const scalar_t* values, const int64_t* context,
                 const int64_t* offsets, scalar_t* out, int64_t batch, int64_t heads, int64_t kv_heads,
                 int64_t head_dim, double scale) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t group = heads / kv_heads;
  const int64_t parts = batch >= 2 * at::get_num_threads() ? 1 : kv_heads;  // pieces of each sequence
  const int64_t heads_per_part = kv_heads / parts;
  at::parallel_for(0, batch * parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> scores, total, inverse;  // a thread's buffers, reused from sequence to sequence
    for (int64_t item = begin; item < end; ++item) {
      const int64_t sequence = item / parts, part = item % parts;
      const int64_t start = offsets[sequence];
      decode_sequence<scalar_t>(queries + sequence * heads * head_dim, keys, values, context + start,
                                offsets[sequence + 1] - start, out + sequence * heads * head_dim,
                                part * heads_per_part, (part + 1) * heads_per_part, group, kv_heads, head_dim, scale,
                                scores, total, inverse);
    }
  });
}

}  // namespace

// queries (B, H, Dh); keys and values (slots, Hkv, Dh), Hkv dividing H; context (N,) int64 pool rows of every
// sequence's keys, one sequence after another; offsets (B + 1,) int64: sequence b reads
// context[offsets[b] : offsets[b + 1]]. Returns (B, H, Dh): softmax(q k^T * scale) v per sequence and head.
torch::Tensor paged_decode(torch::Tensor queries, torch::Tensor keys, torch::Tensor values, torch::Tensor context,
                           torch::Tensor offsets, double scale) {
  TORCH_CHECK(queries.dim() == 3 && keys.dim() == 3 && keys.sizes() == values.sizes(),
              "paged_decode: queries (B, H, Dh), keys and values (slots, Hkv, Dh)");
  TORCH_CHECK(queries.is_contiguous() && keys.is_contiguous() && values.is_contiguous() && context.is_contiguous() &&
                  offsets.is_contiguous(), "paged_decode: contiguous tensors only");
  TORCH_CHECK(queries.scalar_type() == keys.scalar_type() && keys.scalar_type() == values.scalar_type(),
              "paged_decode: queries, keys and values of one dtype");
  TORCH_CHECK(context.scalar_type() == at::kLong && offsets.scalar_type() == at::kLong,
              "paged_decode: int64 context and offsets");
  const int64_t batch = queries.size(0), heads = queries.size(1), head_dim = queries.size(2);
  const int64_t kv_heads = keys.size(1);
  TORCH_CHECK(keys.size(2) == head_dim && kv_heads > 0 && heads % kv_heads == 0,
              "paged_decode: key/value heads must divide query heads, head sizes equal");
  TORCH_CHECK(offsets.size(0) == batch + 1, "paged_decode: offsets must have B + 1 entries");
  const int64_t* rows = context.data_ptr<int64_t>();
  const int64_t slots = keys.size(0), count = context.numel();
  const int64_t* bounds = offsets.data_ptr<int64_t>();
  TORCH_CHECK(bounds[0] == 0 && bounds[batch] == count, "paged_decode: offsets must run from 0 to the context's size");
  for (int64_t b = 0; b < batch; ++b) TORCH_CHECK(bounds[b] <= bounds[b + 1], "paged_decode: offsets must not fall");
  for (int64_t i = 0; i < count; ++i) TORCH_CHECK(rows[i] >= 0 && rows[i] < slots, "paged_decode: a context row is outside the pool");
  auto out = torch::empty_like(queries);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, queries.scalar_type(), "paged_decode", [&] {
    decode_rows<scalar_t>(queries.data_ptr<scalar_t>(), keys.data_ptr<scalar_t>(), values.data_ptr<scalar_t>(),
                          context.data_ptr<int64_t>(), offsets.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), batch,
                          heads, kv_heads, head_dim, scale);
  });
  return out;
}
