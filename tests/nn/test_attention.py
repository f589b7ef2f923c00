"""The reference and fused attention paths agree, the one mask convention (AttentionMask) means the
same to every kernel, and caches behave."""

import itertools
import math

import pytest
import torch

from tformer.nn.attention import (
    KERNELS,
    AttentionMask,
    KVCache,
    MultiHeadAttention,
    additive_mask,
    attention,
    attention_reference,
    causal_mask,
)

B, TQ, TK, DH = 2, 5, 7, 8


def relative_error(a, b):
    return ((a - b).norm() / b.norm()).item()


def qkv(heads=4, kv_heads=4, tq=TQ, tk=TK):
    return (torch.randn(B, heads, tq, DH), torch.randn(B, kv_heads, tk, DH), torch.randn(B, kv_heads, tk, DH))


def padding(lengths, total):
    return (torch.arange(total)[None, :] >= total - torch.tensor(lengths)[:, None]).long()  # left padding


def dense(q_len=TQ, k_len=TK, **parts):
    """The additive mask an AttentionMask of these parts gives the dense kernels."""
    return AttentionMask(**parts).dense(q_len, k_len, torch.float32, torch.device("cpu"))[0]


def random_bias(query_positions, key_positions):  # a position bias (B, H, Tq, Tk) that ignores its positions
    generator = torch.Generator().manual_seed(3)
    return torch.randn(B, 4, query_positions.shape[1], key_positions.shape[1], generator=generator)


POSITIONS = dict(query_positions=torch.arange(TK - TQ, TK).expand(B, TQ), key_positions=torch.arange(TK).expand(B, TK))
MASK_CASES = {
    "none": lambda: (None, False, TQ, TK),
    "causal-square": lambda: (None, True, TK, TK),
    "causal-offset": lambda: (dense(causal=True), False, TQ, TK),
    "padding": lambda: (dense(key_padding=padding([7, 4], TK).bool()), False, TQ, TK),
    "causal+padding": lambda: (dense(causal=True, key_padding=padding([7, 5], TK).bool()), False, TQ, TK),
    "bias": lambda: (torch.randn(1, 4, TQ, TK), False, TQ, TK),
    "bias+causal+padding": lambda: (
        dense(causal=True, key_padding=padding([6, 7], TK).bool(), position_bias=random_bias, **POSITIONS),
        False, TQ, TK,
    ),
}


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("case", list(MASK_CASES))
def test_fast_path_matches_reference(case, kv_heads):
    mask, is_causal, tq, tk = MASK_CASES[case]()
    q, k, v = qkv(4, kv_heads, tq, tk)
    fast, _ = attention(q, k, v, mask=mask, is_causal=is_causal)
    reference, weights = attention_reference(q, k, v, mask=mask, is_causal=is_causal)
    assert relative_error(fast, reference) <= 1e-5
    assert torch.all(weights >= 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), rtol=0, atol=1e-6)


def brute_force_attention(q, k, v, bias, causal):
    """Attention one query at a time in float64, from the definition: softmax over the keys the
    query may see (keys <= its position when causal) of q.k / sqrt(Dh) + bias, times the values."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    groups = q.shape[1] // k.shape[1]
    for b, h, i in itertools.product(range(q.shape[0]), range(q.shape[1]), range(q.shape[2])):
        visible = i + 1 if causal else k.shape[2]
        keys, values = k[b, h // groups, :visible].double(), v[b, h // groups, :visible].double()
        scores = keys @ q[b, h, i].double() / math.sqrt(q.shape[-1]) + bias[b % bias.shape[0], h, i, :visible].double()
        out[b, h, i] = torch.softmax(scores, dim=0) @ values
    return out


@pytest.mark.parametrize("kv_heads", [4, 1], ids=["mha", "mqa"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "reference"])
def test_is_causal_with_a_bias_mask_keeps_causality(kv_heads, need_weights):
    q, k, v = qkv(4, kv_heads, TK, TK)
    bias = torch.randn(1, 4, TK, TK)  # an additive position bias, no causality of its own
    out, _ = attention(q, k, v, mask=bias, is_causal=True, need_weights=need_weights)
    expected = brute_force_attention(q, k, v, bias, causal=True)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)
    # The future matters without causality, so the check above has power.
    assert (brute_force_attention(q, k, v, bias, causal=False) - expected).abs().max() > 0.1


def test_need_weights_returns_the_reference_weights():
    q, k, v = qkv()
    out, weights = attention(q, k, v, need_weights=True)
    assert weights.shape == (B, 4, TQ, TK)
    torch.testing.assert_close(out, weights @ v)


def test_fully_masked_rows_stay_finite():
    q, k, v = qkv(tq=TK)
    out, _ = attention(q, k, v, mask=dense(TK, TK, causal=True, key_padding=padding([2, 7], TK).bool()))
    assert torch.isfinite(out).all()


def test_what_the_dense_form_needs_and_skips():
    assert AttentionMask(causal=True).dense(TK, TK, torch.float32, torch.device("cpu")) == (None, True)
    assert AttentionMask(causal=True).dense(1, TK, torch.float32, torch.device("cpu")) == (None, False)  # sees all
    assert AttentionMask().dense(TQ, TK, torch.float32, torch.device("cpu")) == (None, False)
    mask = AttentionMask(causal=True, key_padding=padding([2, 7], TK).bool())
    first = mask.dense(TQ, TK, torch.float32, torch.device("cpu"))[0]
    assert mask.dense(TQ, TK, torch.float32, torch.device("cpu"))[0] is first  # built once, shared by every layer
    # Left padding: query i of row 0 (two real keys, the last two) sees a key only from key 5 on.
    empty = mask.empty_rows(TQ, TK)
    assert empty[0, 0, :, 0].tolist() == [True, True, True, False, False]
    assert not empty[1].any()


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_every_kernel_gives_zero_to_a_query_that_sees_no_key(kernel):
    settings = {"sliding_window": {"attention_window": 3}}.get(kernel, {})
    mha = MultiHeadAttention(16, num_heads=4, num_kv_heads=2, kernel=kernel, kernel_settings=settings).eval()
    x = torch.randn(B, TK, 16)
    mask = AttentionMask(causal=True, key_padding=padding([3, 7], TK).bool())
    with torch.no_grad():
        out, _ = mha(x, mask=mask)
        values_only = mha.out_proj(torch.zeros(B, TK, 16))  # what attention output 0 becomes
    torch.testing.assert_close(out[0, :4], values_only[0, :4])  # the four padding queries of row 0
    assert (out[1] - values_only[1]).abs().amax() > 1e-3


def test_is_causal_with_unequal_lengths_is_refused():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="explicit mask"):
        attention(q, k, v, is_causal=True)


def test_causal_mask_offset_lets_the_last_queries_see_the_cache():
    allowed = causal_mask(2, 5)
    assert allowed.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert additive_mask(allowed, torch.float32)[0, 4] == torch.finfo(torch.float32).min


def test_cross_attention_and_masks():
    mha = MultiHeadAttention(16, num_heads=4, num_kv_heads=2, cross=True)
    x, context = torch.randn(B, 3, 16), torch.randn(B, 6, 16)
    out, weights = mha(x, context=context, need_weights=True)
    assert out.shape == (B, 3, 16) and weights.shape == (B, 4, 3, 6)
    mask = AttentionMask(key_padding=padding([6, 2], 6).bool())
    _, weights = mha(x, context=context, mask=mask, need_weights=True)
    assert torch.all(weights[1, :, :, :4] == 0)


def test_kv_parameters_shrink_by_the_group_factor():
    def kv_params(kv_heads):
        mha = MultiHeadAttention(64, num_heads=8, num_kv_heads=kv_heads, bias=False)
        return mha.qkv_proj.weight.shape[0] - 64  # rows beyond the queries: keys + values

    assert kv_params(8) == 128 and kv_params(2) == 128 // 4 and kv_params(1) == 128 // 8


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_incremental_cache_equals_full_pass(kv_heads):
    mha = MultiHeadAttention(32, num_heads=4, num_kv_heads=kv_heads).eval()
    x = torch.randn(B, 9, 32)
    causal = AttentionMask(causal=True)
    full, _ = mha(x, mask=causal)
    cache = KVCache(B, kv_heads, 16, 8)
    first, _ = mha(x[:, :4], mask=causal, cache=cache)
    outputs = [first]
    for t in range(4, 9):
        step, _ = mha(x[:, t : t + 1], mask=causal, cache=cache)
        outputs.append(step)
    assert relative_error(torch.cat(outputs, 1), full) <= 1e-5
    assert cache.length == 9
    assert cache.nbytes() == 2 * B * kv_heads * 16 * 8 * 4


def test_cache_overflow_is_a_clear_error():
    cache = KVCache(1, 1, 2, 4)
    with pytest.raises(ValueError, match="overflow"):
        cache.append(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4))
