"""Property-based checks (hypothesis) of every attention kernel against attention's definition, written
here from the formula in float64: random lengths, query and key block sizes, sliding windows (a key block
starting exactly at a query's window edge among them), arbitrary key padding, position biases (ALiBi,
relative buckets, a free tensor), grouped heads, causal or not, a block of queries continuing a cache;
the rolling cache of a sliding window over random step sizes and rewinds; Performer against the
quadratic random-feature kernel it stands for. The hand-picked cases in test_attention_kernels.py stay
as readable examples; these search the corners between them. Every search is derandomized (the same
examples on every run), so a failure reproduces and CI is not flaky."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tformer.nn.attention import AttentionMask, chunked_attention
from tformer.nn.attention.registry import KERNELS, kernel_class
from tformer.nn.favor import performer_attention, random_features
from tformer.nn.positions import ALiBi, RelativePositionBias

B, H, DH = 2, 4, 8
F64 = torch.float64
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True)


def relative_error(got, want):
    """||got - want|| / ||want||, or the absolute error where ``want`` is all zeros (every query blind)."""
    difference = (got - want).norm()
    return (difference / want.norm() if want.norm() > 0 else difference).item()


def allowed_by_definition(q_len, k_len, causal, window):
    """(Tq, Tk) bool, True = query row i may see key j. The queries are the last Tq of the Tk positions
    (row i is at position i + Tk - Tq); causal: j <= i; a window W: i - W <= j (causal) or |i - j| <= W."""
    query_positions = torch.arange(q_len)[:, None] + (k_len - q_len)
    key_positions = torch.arange(k_len)[None, :]
    allowed = torch.ones(q_len, k_len, dtype=torch.bool)
    if causal:
        allowed &= key_positions <= query_positions
    if window is not None:
        allowed &= (query_positions - key_positions).abs() <= window
    return allowed


def attention_by_definition(q, k, v, allowed, bias=None):
    """softmax(q k^T / sqrt(Dh) + bias) v over the keys each query may see (``allowed``, broadcast to
    (B, H, Tq, Tk)); 0 for a query that sees none. Key/value head h // G serves query head h. In float64."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    allowed = allowed.expand(scores.shape)
    sees_a_key = allowed.any(-1, keepdim=True)
    scores = scores.masked_fill(~allowed, -math.inf).masked_fill(~sees_a_key, 0.0)  # blind rows: finite
    weights = torch.softmax(scores, dim=-1) * sees_a_key
    return torch.matmul(weights, v)


@st.composite
def attention_cases(draw, windows=True):
    """A problem of attention: shapes, causality, a window (or None), key padding (or None) and which bias.

    Windows and causality put the queries at the last Tq of the Tk positions (Tq <= Tk); without either,
    queries and keys may have any lengths (cross-attention)."""
    causal = draw(st.booleans())
    window = draw(st.none() | st.integers(0, 12)) if windows else None
    k_len = draw(st.integers(1, 20))
    q_len = draw(st.integers(1, k_len)) if causal or window is not None else draw(st.integers(1, 20))
    padding = None
    if draw(st.booleans()):
        bits = draw(st.lists(st.booleans(), min_size=B * k_len, max_size=B * k_len))
        padding = torch.tensor(bits).view(B, k_len)
    return {
        "q_len": q_len, "k_len": k_len, "causal": causal, "window": window, "padding": padding,
        "kv_heads": draw(st.sampled_from([H, 2, 1])),
        "bias": draw(st.sampled_from([None, "alibi", "relative", "tensor"])),
        "seed": draw(st.integers(0, 2**16)),
    }


def tensors(case, dtype=F64):
    """q (B, H, Tq, Dh), k and v (B, Hkv, Tk, Dh) requiring grad, drawn from the case's seed."""
    generator = torch.Generator().manual_seed(case["seed"])

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).requires_grad_()

    return draw(B, H, case["q_len"], DH), draw(B, case["kv_heads"], case["k_len"], DH), \
        draw(B, case["kv_heads"], case["k_len"], DH)


def position_bias(kind, causal, dtype=F64):
    """A position bias (query positions (B, Tq), key positions (B, Tk)) -> (B, H, Tq, Tk), and the parameter
    it reads (None for ALiBi). Relative buckets are small (8, distance 6) so the lengths reach their log part."""
    if kind == "alibi":
        alibi = ALiBi(H)
        return (lambda query_positions, key_positions: alibi(query_positions, key_positions).to(dtype)), None
    relative = RelativePositionBias(H, bidirectional=not causal, num_buckets=8, max_distance=6).to(dtype)
    torch.nn.init.normal_(relative.embedding.weight, std=1.0)
    return relative, relative.embedding.weight


def check_gradients(out, expected, leaves, tolerance):
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    got = torch.autograd.grad(out, leaves, upstream, allow_unused=True)
    want = torch.autograd.grad(expected, leaves, upstream, allow_unused=True)
    for index, (got_grad, want_grad) in enumerate(zip(got, want, strict=True)):
        got_grad = torch.zeros_like(leaves[index]) if got_grad is None else got_grad
        want_grad = torch.zeros_like(leaves[index]) if want_grad is None else want_grad
        assert relative_error(got_grad, want_grad) <= tolerance, f"gradient of input {index}"


# ---- chunked_attention: blocks, windows, padding, biases ----------------------------------------------------


@PROPERTY
@given(case=attention_cases(), query_block=st.integers(1, 9), key_block=st.integers(1, 9))
def test_chunked_attention_equals_the_definition_with_its_gradients(case, query_block, key_block):
    """Outputs and gradients (q, k, v and the bias's parameters or tensor) in float64, where both sides
    round at ~1e-16 per operation: 1e-9 is far above the rounding and far below any wrongly masked key."""
    q, k, v = tensors(case)
    q_len, k_len, causal = case["q_len"], case["k_len"], case["causal"]
    positions = torch.arange(k_len).expand(B, k_len)  # the keys' positions; the queries are the last Tq
    bias_argument, bias_dense, leaves = None, None, [q, k, v]
    if case["bias"] == "tensor":
        shape = (1 if case["seed"] % 2 else B, H, q_len, k_len)
        bias_argument = torch.randn(shape, generator=torch.Generator().manual_seed(2), dtype=F64).requires_grad_()
        bias_dense, leaves = bias_argument, [*leaves, bias_argument]
    elif case["bias"] is not None and (causal or case["window"] is not None or q_len == k_len):
        bias, weight = position_bias(case["bias"], causal)
        query_positions = positions[:, k_len - q_len:]

        def bias_argument(query_index, key_index):
            return bias(query_positions[:, query_index], positions[:, key_index])

        bias_dense = bias(query_positions, positions)
        leaves = leaves if weight is None else [*leaves, weight]
    out = chunked_attention(q, k, v, causal=causal, key_padding_mask=case["padding"], bias=bias_argument,
                            query_block=query_block, key_block=key_block, window=case["window"])
    allowed = allowed_by_definition(q_len, k_len, causal, case["window"])[None, None]
    if case["padding"] is not None:
        allowed = allowed & case["padding"][:, None, None, :]
    expected = attention_by_definition(q, k, v, allowed, bias_dense)
    assert relative_error(out, expected) <= 1e-9
    check_gradients(out, expected, leaves, 1e-9)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_chunked_windows_at_every_block_alignment(causal):
    """Every window up to the sequence length and query and key blocks of 1 to 4 at two lengths, so each way
    a key block can meet a window's edge (its first key exactly W before a query, its last key exactly W
    after, one past either, a window clamped at position 0) is met, not sampled."""
    for q_len, k_len in ((7, 7), (5, 8)):
        q, k, v = (t.detach() for t in tensors({"q_len": q_len, "k_len": k_len, "kv_heads": 2, "seed": k_len}))
        for window in range(k_len + 1):
            expected = attention_by_definition(q, k, v, allowed_by_definition(q_len, k_len, causal, window))
            for query_block in range(1, 5):
                for key_block in range(1, 5):
                    out = chunked_attention(q, k, v, causal=causal, window=window, query_block=query_block,
                                            key_block=key_block)
                    assert relative_error(out, expected) <= 1e-9, (q_len, k_len, window, query_block, key_block)


# ---- the registered kernels, called as a layer calls them ---------------------------------------------------


@PROPERTY
@given(case=attention_cases(), name=st.sampled_from(sorted(set(KERNELS) - {"performer"})),
       with_gradients=st.booleans())
def test_every_exact_kernel_and_the_sliding_window_equal_the_definition(case, name, with_gradients):
    """Each kernel under the AttentionMask a layer gives it (causality, padding, a position bias of the
    positions counted over real tokens), in float32 as models run: 1e-5 of the output's norm is some
    fifty float32 roundings (~6e-8 each), while one key wrongly seen or missed moves it by percent.
    Without gradients a chunked kernel takes its one-block fused path, with them its blocked one. FlexAttention has
    no backward pass on the CPU: flex's gradients are checked on a GPU (tests/test_cuda.py)."""
    q_len, k_len, causal = case["q_len"], case["k_len"], case["causal"]
    kernel_type = kernel_class(name)
    with_gradients = with_gradients and kernel_type.trains_on_cpu
    window, settings_of_kernel = None, {}
    if name == "sliding_window":  # W >= 1; None drawn: a window wider than every distance, i.e. full attention
        window = k_len if case["window"] is None else max(case["window"], 1)
        settings_of_kernel = {"attention_window": window}
        q_len = min(q_len, k_len)  # self-attention: never more queries than keys
    kernel = kernel_type(DH, **settings_of_kernel)
    q, k, v = tensors({**case, "q_len": q_len}, dtype=torch.float32)
    padding = case["padding"]
    key_positions = torch.arange(k_len).expand(B, k_len) if padding is None else \
        (padding.long().cumsum(-1) - 1).clamp(min=0)  # counted over real tokens, as the stack counts them
    query_positions = key_positions[:, k_len - q_len:] if q_len <= k_len else torch.arange(q_len).expand(B, q_len)
    bias, bias_dense = None, None
    if case["bias"] in ("alibi", "relative"):
        bias = position_bias(case["bias"], causal, torch.float32)[0]
        bias_dense = bias(query_positions, key_positions).double()
    mask = AttentionMask(causal, padding, query_positions, key_positions, bias)
    with torch.set_grad_enabled(with_gradients):
        out, _ = kernel(q, k, v, mask)
    allowed = allowed_by_definition(q_len, k_len, causal, window)[None, None]
    if padding is not None:
        allowed = allowed & padding[:, None, None, :]
    expected = attention_by_definition(*(t.double() for t in (q, k, v)), allowed, bias_dense)
    assert out.dtype == torch.float32
    assert relative_error(out.double(), expected) <= 1e-5
    if with_gradients:
        check_gradients(out.double(), expected, [q, k, v], 1e-5)
    if kernel_type.weights:  # the weights, when asked for: the definition's, zero outside what a query sees
        _, weights = kernel(q.detach(), k.detach(), v.detach(), mask, need_weights=True)
        assert torch.all(weights.masked_select(~allowed.expand(weights.shape)) == 0)
        sums = weights.double().sum(-1)
        assert torch.allclose(sums, allowed.expand(weights.shape).any(-1).double(), atol=1e-5)


# ---- decoding a sliding window through its rolling cache ----------------------------------------------------


@PROPERTY
@given(window=st.integers(1, 6), seed=st.integers(0, 2**16), fused=st.booleans(),
       steps=st.lists(st.tuples(st.integers(1, 9) | st.integers(70, 110), st.integers(0, 3)), min_size=1, max_size=25))
def test_a_rolling_cache_over_any_steps_and_rewinds_equals_the_whole_band(window, seed, fused, steps):
    """Steps of a few new tokens or of about the buffer's size (W + 80 positions), each followed by taking back
    up to 3 (rejected drafts, when the cache still holds the window), past the buffer's moves to its front:
    every step's output equals band attention over the whole sequence so far, at the new rows (float64; 1e-9
    as above). ``fused``: without gradients, as decoding runs, the kernel takes its one-block path."""
    kernel = kernel_class("sliding_window")(DH, attention_window=window)
    cache = kernel.new_cache(1, 2, 10_000, DH, F64, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    keys, values = (torch.empty(1, 2, 0, DH, dtype=F64) for _ in range(2))
    for new, taken_back in steps:
        q, k, v = (torch.randn(1, heads, new, DH, generator=generator, dtype=F64) for heads in (H, 2, 2))
        keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
        with torch.set_grad_enabled(not fused):
            out, _ = cache.attend(kernel, q, k, v, AttentionMask(causal=True, real_queries=True))
        length = keys.shape[2]
        first = max(0, length - new - window)  # the oldest key any new query sees
        expected = attention_by_definition(q, keys[:, :, first:], values[:, :, first:],
                                           allowed_by_definition(new, length - first, True, window))
        assert relative_error(out, expected) <= 1e-9, (length, new)
        taken_back = min(taken_back, length)
        back = length - taken_back
        try:
            cache.length = back
        except ValueError:
            assert cache.held - taken_back < min(back, window)  # refused only when the window is gone
            continue
        keys, values = keys[:, :, :back], values[:, :, :back]


# ---- Performer: the random-feature kernel it computes in linear time ----------------------------------------


@PROPERTY
@given(case=attention_cases(windows=False), num_features=st.integers(1, 24), chunk_size=st.integers(1, 9),
       scale=st.sampled_from([None, 0.3]))
def test_performer_equals_the_quadratic_random_feature_kernel(case, num_features, chunk_size, scale):
    """Performer's output is exactly phi(q) phi(k)^T, masked and row-normalised, times v (phi(x) =
    exp(x W^T - |x|^2 / 2) on x scaled by scale ** 0.5): its approximation of softmax is test_performer.py's
    business, this is the computation, in float64, over causal scans of any chunk size, a block continuing
    a cache, padding, grouped heads. 1e-9: the stabilisers cancel exactly, leaving float64 rounding."""
    q, k, v = (t.detach() for t in tensors(case))
    weights = random_features(num_features, DH, generator=torch.Generator().manual_seed(case["seed"]), dtype=F64)
    factor = (1.0 / math.sqrt(DH) if scale is None else scale) ** 0.5

    def phi(x):
        x = x * factor
        return torch.exp(x @ weights.T - x.square().sum(-1, keepdim=True) / 2)

    groups = H // case["kv_heads"]
    similarity = phi(q) @ phi(k.repeat_interleave(groups, 1)).transpose(-2, -1)  # (B, H, Tq, Tk)
    allowed = allowed_by_definition(case["q_len"], case["k_len"], case["causal"], None)[None, None]
    if case["padding"] is not None:
        allowed = allowed & case["padding"][:, None, None, :]
    similarity = similarity * allowed
    total = similarity.sum(-1, keepdim=True)
    expected = torch.where(total > 0, similarity / total.clamp(min=1e-300), 0.0) @ v.repeat_interleave(groups, 1)
    got = performer_attention(q, k, v, weights, causal=case["causal"], key_padding_mask=case["padding"],
                              scale=scale, chunk_size=chunk_size)
    assert relative_error(got, expected) <= 1e-9
