"""FAVOR+ Performer attention: it estimates exact softmax attention (better with more features, and with
orthogonal ones), respects causality, padding and grouped heads exactly, and redraws its projection on time."""

import math

import pytest
import torch
from torch import nn

from tformer.nn.attention import attention_reference
from tformer.nn.favor import PerformerProjection, performer_attention, random_features

B, H, T, DH = 2, 4, 64, 16


def relative_error(approx, exact):
    return ((approx - exact).norm() / exact.norm()).item()


def inputs(seed, heads=H, kv_heads=H, q_len=T, k_len=T, head_dim=DH, qk_std=0.5, dtype=torch.float32):
    """q, k with N(0, qk_std^2) entries (attention logits q.k/sqrt(Dh) of std qk_std^2), v with N(0, 1)."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(B, heads, q_len, head_dim, generator=generator, dtype=dtype) * qk_std
    k = torch.randn(B, kv_heads, k_len, head_dim, generator=generator, dtype=dtype) * qk_std
    v = torch.randn(B, kv_heads, k_len, head_dim, generator=generator, dtype=dtype)
    return q, k, v


def projection(num_features, seed=0, orthogonal=True, head_dim=DH, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return random_features(num_features, head_dim, orthogonal=orthogonal, generator=generator, dtype=dtype)


def mean_error(q, k, v, num_features, causal, orthogonal=True, seeds=range(4)):
    exact, _ = attention_reference(q, k, v, is_causal=causal)
    return sum(relative_error(performer_attention(q, k, v, projection(num_features, seed, orthogonal), causal=causal),
                              exact) for seed in seeds) / len(seeds)


# ---- the estimate -------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_equals_the_normalised_random_feature_kernel(causal):
    """The linear-time computation equals the quadratic one it stands for: softmax weights replaced by
    phi(q) . phi(k), phi(x) = exp(x W^T - |x|^2 / 2) on x = x * scale**0.5, rows normalised (float64)."""
    q, k, v = inputs(0, dtype=torch.float64)
    weights = projection(32, dtype=torch.float64)
    scale = 0.3

    def phi(x):
        x = x * scale ** 0.5
        return torch.exp(x @ weights.T - x.square().sum(-1, keepdim=True) / 2)

    kernel = phi(q) @ phi(k).transpose(-2, -1)  # (B, H, T, T)
    if causal:
        kernel = kernel.tril()
    expected = (kernel / kernel.sum(-1, keepdim=True)) @ v
    got = performer_attention(q, k, v, weights, causal=causal, scale=scale, chunk_size=7)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_error_falls_as_features_grow(causal):
    q, k, v = inputs(1)
    few, many = mean_error(q, k, v, 64, causal), mean_error(q, k, v, 1024, causal)
    assert many < 0.7 * few, (few, many)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_orthogonal_features_beat_independent_ones(causal):
    """At M = 4 Dh on small-norm inputs (where the paper's variance argument applies) orthogonal blocks
    give a lower mean error over 12 draws. (With large |q|, |k| the two are level: see
    benchmarks/performer_error.py.)"""
    q, k, v = inputs(2)
    seeds = range(12)
    orthogonal = mean_error(q, k, v, 4 * DH, causal, orthogonal=True, seeds=seeds)
    independent = mean_error(q, k, v, 4 * DH, causal, orthogonal=False, seeds=seeds)
    assert orthogonal < 0.9 * independent, (orthogonal, independent)


def test_many_features_give_a_small_error():
    """With 8192 features the weights are within 3 standard deviations of the estimator's own spread.

    v = identity makes the output the attention matrix itself. One feature estimates exp(q'.k') with
    relative variance exp(|q' + k'|^2) - 1 (q' = q scale**0.5), so M i.i.d. features give a relative
    standard deviation sqrt((exp(|q' + k'|^2) - 1) / M) per entry; normalising rows does not raise it
    to first order, and orthogonal features only lower it."""
    head_dim, length, num_features = 8, 32, 8192
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, length, head_dim, generator=generator) * 0.5
    k = torch.randn(1, 2, length, head_dim, generator=generator) * 0.5
    v = torch.eye(length).expand(1, 2, length, length)
    exact, weights = attention_reference(q, k, v)
    got = performer_attention(q, k, v, projection(num_features, head_dim=head_dim))
    root = head_dim ** -0.25
    sums = (q * root).unsqueeze(-2) + (k * root).unsqueeze(-3)  # (1, 2, T, T, Dh)
    spread = math.sqrt(((sums.square().sum(-1).exp() - 1) * weights.square()).sum() / weights.square().sum()
                       / num_features)
    error = relative_error(got, exact)
    assert spread < 0.05  # the bound is small: this case is easy, as it should be
    assert error < 3 * spread, (error, spread)


# ---- exact properties ---------------------------------------------------------------------


def test_causal_never_looks_ahead():
    """Changing keys and values after position t leaves outputs up to t bitwise equal (t inside a chunk)."""
    q, k, v = inputs(4, q_len=50, k_len=50)
    weights = projection(32)
    before = performer_attention(q, k, v, weights, causal=True, chunk_size=16)
    for t in (0, 20, 31, 32, 49):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, t + 1:] = torch.randn_like(k2[:, :, t + 1:]) * 3
        v2[:, :, t + 1:] = torch.randn_like(v2[:, :, t + 1:])
        after = performer_attention(q, k2, v2, weights, causal=True, chunk_size=16)
        assert torch.equal(after[:, :, : t + 1], before[:, :, : t + 1]), t
        if t < 49:
            assert not torch.equal(after[:, :, t + 1:], before[:, :, t + 1:])


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_padded_keys_change_nothing(causal):
    q, k, v = inputs(5, k_len=T)
    lengths = torch.tensor([T, 41])
    valid = torch.arange(T)[None, :] >= T - lengths[:, None]  # left padding, True = attend: (B, T)
    weights = projection(64)
    out = performer_attention(q, k, v, weights, causal=causal, key_padding_mask=valid)
    k2, v2 = k.clone(), v.clone()
    k2[~valid[:, None, :].expand(B, H, T)] = 50.0  # huge keys would dominate any max they entered
    v2[~valid[:, None, :].expand(B, H, T)] = -7.0
    assert torch.equal(performer_attention(q, k2, v2, weights, causal=causal, key_padding_mask=valid), out)
    # And the padded row equals a call on its unpadded keys (causal: its queries at the same positions).
    start = T - 41
    alone = performer_attention(q[1:, :, start:] if causal else q[1:], k[1:, :, start:], v[1:, :, start:], weights,
                                causal=causal)
    torch.testing.assert_close(out[1:, :, start:] if causal else out[1:], alone, rtol=1e-5, atol=1e-6)


def test_a_query_that_sees_no_key_gets_zeros():
    q, k, v = inputs(6, q_len=8, k_len=8)
    valid = torch.ones(B, 8, dtype=torch.bool)
    valid[1] = False
    valid[0, :3] = False
    weights = projection(16)
    bidirectional = performer_attention(q, k, v, weights, key_padding_mask=valid)
    causal = performer_attention(q, k, v, weights, causal=True, key_padding_mask=valid)
    assert torch.all(bidirectional[1] == 0) and torch.all(causal[1] == 0) and torch.all(causal[0, :, :3] == 0)
    assert torch.isfinite(causal).all() and torch.all(causal[0, :, 3:].abs().sum(-1) > 0)


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_grouped_heads_equal_the_expanded_call(kv_heads, causal):
    q, k, v = inputs(7, kv_heads=kv_heads)
    weights = projection(48)
    grouped = performer_attention(q, k, v, weights, causal=causal, chunk_size=24)
    groups = H // kv_heads
    expanded = performer_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), weights,
                                   causal=causal, chunk_size=24)
    torch.testing.assert_close(grouped, expanded, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("q_len", [1, 13, 40])
def test_causal_continuation_equals_the_last_rows(q_len):
    """Queries fewer than keys are the last positions: a block continuing a cache gets the full call's rows."""
    q, k, v = inputs(8)
    weights = projection(32)
    full = performer_attention(q, k, v, weights, causal=True, chunk_size=16)
    block = performer_attention(q[:, :, -q_len:], k, v, weights, causal=True, chunk_size=16)
    torch.testing.assert_close(block, full[:, :, -q_len:], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 5, 64, 1000])
def test_chunk_size_does_not_change_the_result(chunk_size):
    q, k, v = inputs(9, k_len=T)
    weights = projection(32)
    torch.testing.assert_close(performer_attention(q, k, v, weights, causal=True, chunk_size=chunk_size),
                               performer_attention(q, k, v, weights, causal=True, chunk_size=T),
                               rtol=1e-5, atol=1e-6)


def test_large_inputs_stay_finite():
    """Logits in the hundreds overflow exp in float32; the stabilisers keep every feature <= 1."""
    q, k, v = inputs(10, qk_std=8.0, dtype=torch.float64)
    weights = projection(64, dtype=torch.float64)
    for causal in (False, True):
        expected = performer_attention(q, k, v, weights, causal=causal)
        got = performer_attention(q.float(), k.float(), v.float(), weights.float(), causal=causal)
        assert torch.isfinite(expected).all() and torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), expected, rtol=0.05, atol=0.05)


def test_half_precision_inputs_are_computed_in_float32():
    q, k, v = inputs(11)
    weights = projection(64)
    for causal in (False, True):
        half = performer_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), weights, causal=causal)
        full = performer_attention(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), weights,
                                   causal=causal)
        assert half.dtype == torch.bfloat16
        torch.testing.assert_close(half.float(), full, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_gradients_match_finite_differences(causal):
    generator = torch.Generator().manual_seed(12)
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    k = torch.randn(1, 1, 7, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    v = torch.randn(1, 1, 7, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    weights = projection(6, head_dim=4, dtype=torch.float64)
    valid = torch.tensor([[False, True, True, True, True, True, True]])
    assert torch.autograd.gradcheck(
        lambda q, k, v: performer_attention(q, k, v, weights, causal=causal, key_padding_mask=valid, chunk_size=2),
        (q, k, v))


# ---- the projection -----------------------------------------------------------------------


def test_random_features_rows_are_gaussian_and_orthogonal_in_blocks():
    num_features, head_dim = 40, 16
    rows = projection(num_features, head_dim=head_dim)
    assert rows.shape == (num_features, head_dim) and rows.dtype == torch.float32
    for start in range(0, num_features, head_dim):
        block = rows[start:start + head_dim]
        gram = block @ block.T
        torch.testing.assert_close(gram - torch.diag(gram.diagonal()), torch.zeros_like(gram), rtol=0, atol=1e-4)
    # Each row is N(0, I): squared lengths chi^2(Dh) (mean Dh), entries of variance 1, over many rows.
    many = projection(64 * 200, head_dim=64)
    assert abs(many.square().sum(-1).mean().item() - 64) < 0.5  # std of the mean: sqrt(128 / 12800) = 0.1
    assert abs(many.std().item() - 1) < 0.01
    torch.testing.assert_close(projection(40, seed=5, head_dim=16), projection(40, seed=5, head_dim=16))
    assert random_features(3, 4, orthogonal=False, dtype=torch.float64).dtype == torch.float64


def test_projection_redraws_every_interval_training_steps_only():
    torch.manual_seed(0)
    module = PerformerProjection(8, 4, redraw_interval=3)
    drawn = [module().clone() for _ in range(7)]  # training mode after construction
    assert all(torch.equal(drawn[i], drawn[0]) for i in range(3))
    assert all(torch.equal(drawn[i], drawn[3]) for i in range(3, 6))
    assert not torch.equal(drawn[3], drawn[0]) and not torch.equal(drawn[6], drawn[3])
    assert module.steps_since_redraw.item() == 1
    module.eval()
    assert all(torch.equal(module(), drawn[6]) for _ in range(10))
    assert module.steps_since_redraw.item() == 1
    never = PerformerProjection(8, 4)
    first = never().clone()
    assert all(torch.equal(never(), first) for _ in range(5))


def test_projection_state_dict_round_trip():
    torch.manual_seed(1)
    source = PerformerProjection(8, 4, redraw_interval=4)
    for _ in range(6):  # one redraw, then 2 steps into the second projection
        source()
    target = PerformerProjection(8, 4, redraw_interval=4)
    target.load_state_dict(source.state_dict())
    assert set(source.state_dict()) == {"projection", "steps_since_redraw"}
    assert torch.equal(target.projection, source.projection) and target.steps_since_redraw.item() == 2
    # Loaded mid-interval, it redraws after the same 2 more steps as the source, and the same rows.
    before = source.projection.clone()
    state = torch.get_rng_state()
    for _ in range(3):
        source()
    torch.set_rng_state(state)
    for _ in range(3):
        target()
    assert not torch.equal(source.projection, before)
    assert torch.equal(target.projection, source.projection)


@pytest.mark.parametrize("loader", ["load_state_dict", "set_model_state_dict"])
def test_a_loaded_counter_is_the_one_counted_on(loader):
    """A layer inside a model, loaded the way checkpoints (load_state_dict) and resumes
    (torch.distributed.checkpoint's set_model_state_dict) load it, counts on from the loaded step."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    source = PerformerProjection(8, 4, redraw_interval=4)
    for _ in range(3):
        source()
    model = nn.ModuleDict({"layer": PerformerProjection(8, 4, redraw_interval=4)})
    state = {f"layer.{name}": tensor for name, tensor in source.state_dict().items()}
    if loader == "load_state_dict":
        model.load_state_dict(state)
    else:
        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
    loaded = model["layer"].projection.clone()
    assert torch.equal(loaded, source.projection)
    assert torch.equal(model["layer"](), loaded)  # the 4th step of this projection
    assert not torch.equal(model["layer"](), loaded)  # the 5th: a new one


# ---- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("call, message", [
    (lambda: random_features(0, 8), "num_features must be an int >= 1"),
    (lambda: random_features(8, 0), "head_dim must be an int >= 1"),
    (lambda: PerformerProjection(0, 8), "num_features must be an int >= 1"),
    (lambda: PerformerProjection(8, 8, redraw_interval=-1), "redraw_interval must be an int >= 0"),
    (lambda: performer_attention(*inputs(0), projection(8, head_dim=8)),
     r"projection must be \(num_features >= 1, head_dim 16\)"),
    (lambda: performer_attention(*inputs(0), torch.empty(0, DH)), "projection must be"),
    (lambda: performer_attention(*inputs(0, kv_heads=3), projection(8)), "3 key/value heads do not divide 4"),
    (lambda: performer_attention(*inputs(0, q_len=9, k_len=8), projection(8), causal=True), "at most as many queries"),
    (lambda: performer_attention(*inputs(0), projection(8), key_padding_mask=torch.ones(B, T)), "must be bool"),
    (lambda: performer_attention(*inputs(0), projection(8), scale=0.0), "scale must be > 0"),
    (lambda: performer_attention(*inputs(0), projection(8), chunk_size=0), "chunk_size must be an int >= 1"),
    (lambda: performer_attention(torch.ones(2, 3, 4), *inputs(0)[1:], projection(8)), r"q must be \(B, H, T, Dh\)"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---- the compiled decoding step ------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2)])
def test_the_compiled_step_equals_the_tensor_operations(dtype, heads, kv_heads):
    """``decode_one`` on the CPU (one pass over the sums in C++) computes what ``decode_one_tensors`` does,
    step after step, through steps whose key raises the running max; both equal full causal attention."""
    from tformer.nn.compiled import load_or_none
    from tformer.nn.favor import (
        decode_one,
        decode_one_tensors,
        decode_unchecked,
        projection_for_decoding,
    )

    if load_or_none() is None:
        pytest.skip("the compiled kernels cannot be built here (decode_one is then decode_one_tensors)")
    q, k, v = inputs(5, heads=heads, kv_heads=kv_heads, q_len=12, k_len=12, dtype=dtype)
    k[:, :, 7] *= 6  # a key whose logits raise the running max mid-way
    weights = projection(40, dtype=dtype)
    scale = DH ** -0.5
    step_weights = projection_for_decoding(weights, dtype, scale)
    _, compiled = decode_unchecked(q[:, :, :4], k[:, :, :4], v[:, :, :4], weights, None)
    _, tensors = decode_unchecked(q[:, :, :4], k[:, :, :4], v[:, :, :4], weights, None)
    steps = []
    for t in range(4, 12):
        position = slice(t, t + 1)
        out, compiled = decode_one(q[:, :, position], k[:, :, position], v[:, :, position], step_weights, compiled,
                                   scale)
        expected, tensors = decode_one_tensors(q[:, :, position], k[:, :, position], v[:, :, position], step_weights,
                                               tensors, scale)
        tolerance = 1e-12 if dtype == torch.float64 else 2e-6
        torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(compiled.sums, tensors.sums, rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(compiled.level, tensors.level, rtol=tolerance, atol=tolerance)
        steps.append(out)
    full = performer_attention(q, k, v, weights, causal=True)
    torch.testing.assert_close(torch.cat(steps, dim=2), full[:, :, 4:], rtol=1e-5, atol=1e-5)
