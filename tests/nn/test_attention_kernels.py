"""The attention kernels: chunked attention equals the reference (outputs and gradients) with every
mask, never forms a (Tq, Tk) matrix, sliding windows equal the reference with a band mask (also through
a rolling cache), every family gives the sdpa logits with each exact kernel, and what a kernel cannot
do is refused with a message."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tformer
from tformer import ModelConfig, build_model
from tformer.checkpoint import CheckpointError
from tformer.generation import GenerationError, StackSession, open_session
from tformer.interop import family_for_model_type
from tformer.nn.attention import (
    AttentionMask,
    MultiHeadAttention,
    RollingKVCache,
    additive_mask,
    attention_reference,
    band_mask,
    chunked_attention,
    kernel_class,
)
from tformer.nn.attention.sliding_window import REWIND_SLACK
from tformer.nn.positions import ALiBi, RelativePositionBias

B, H, DH = 2, 4, 8
F64 = torch.float64


def relative_error(a, b):
    """||a - b|| / ||b||; the absolute error where b is exactly zero (a query seeing only itself has no
    gradient through its scores: the reference gives 0, the blocked kernel its rounding, ~1e-16)."""
    difference = (a - b).norm()
    return (difference / b.norm() if b.norm() > 0 else difference).item()


def inputs(tq, tk, kv_heads=H, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def tensor(*shape):
        return torch.randn(*shape, generator=generator, dtype=F64, requires_grad=True)

    return tensor(B, H, tq, DH), tensor(B, kv_heads, tk, DH), tensor(B, kv_heads, tk, DH)


def right_padding(lengths, total):
    """(B, total) bool, True = a real key: row b's first lengths[b] positions (no query row is left blind)."""
    return torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]


def reference(q, k, v, allowed, bias=None, softcap=None):
    """attention_reference with the boolean mask ``allowed`` (broadcastable to (B, H, Tq, Tk)), a bias and a
    soft cap on the scores.

    The additive mask is float32's: attention_reference takes its softmax in float32, where float64's
    most negative number would become -inf."""
    mask = additive_mask(allowed, torch.float32)
    return attention_reference(q, k, v, mask if bias is None else mask + bias, softcap=softcap)[0]


def alibi_bias():
    alibi = ALiBi(H)
    positions = torch.arange(64)[None]
    return lambda qi, ki: alibi(positions[:, qi], positions[:, ki]), None


def relative_bias(bidirectional):
    relative = RelativePositionBias(H, bidirectional, num_buckets=8, max_distance=16).double()
    positions = torch.arange(64)[None]
    return lambda qi, ki: relative(positions[:, qi], positions[:, ki]), relative.embedding.weight


# name: (Tq, Tk, kv heads, causal, key lengths or None, bias maker or None, query block, key block)
CASES = {
    "plain": (12, 12, H, False, None, None, 4, 4),
    "causal": (13, 13, H, True, None, None, 4, 5),
    "padding": (11, 11, H, False, [11, 6], None, 3, 4),
    "causal+padding": (11, 11, H, True, [11, 7], None, 4, 3),
    "cross": (5, 13, H, False, [13, 9], None, 2, 4),
    "causal-continuing-a-cache": (4, 13, H, True, None, None, 3, 5),
    "gqa": (9, 9, 2, True, None, None, 4, 4),
    "mqa": (9, 10, 1, False, [10, 8], None, 4, 3),
    "alibi": (13, 13, 2, True, None, alibi_bias, 5, 3),
    "relative-causal": (13, 13, H, True, [13, 9], lambda: relative_bias(False), 4, 6),
    "relative-bidirectional": (10, 10, 2, False, [10, 7], lambda: relative_bias(True), 3, 4),
    "odd-one-block": (7, 7, H, True, None, None, 128, 128),
}


@pytest.mark.parametrize("softcap", [None, 0.7], ids=["", "softcap"])  # 0.7: most scores well into the tanh's bend
@pytest.mark.parametrize("name", list(CASES))
def test_chunked_equals_reference_outputs_and_gradients(name, softcap):
    tq, tk, kv_heads, causal, lengths, make_bias, query_block, key_block = CASES[name]
    q, k, v = inputs(tq, tk, kv_heads)
    padding = None if lengths is None else right_padding(lengths, tk)
    bias, weight = make_bias() if make_bias else (None, None)
    out = chunked_attention(q, k, v, causal=causal, key_padding_mask=padding, bias=bias,
                            query_block=query_block, key_block=key_block, softcap=softcap)
    allowed = torch.ones(tq, tk, dtype=torch.bool)
    if causal:
        allowed = torch.arange(tk)[None, :] <= torch.arange(tq)[:, None] + (tk - tq)
    allowed = allowed[None, None] if padding is None else allowed & padding[:, None, None, :]
    dense_bias = None if bias is None else bias(torch.arange(tq), torch.arange(tk))
    expected = reference(q, k, v, allowed, dense_bias, softcap)
    assert relative_error(out, expected) <= 1e-5
    upstream = torch.randn_like(out)
    leaves = (q, k, v) if weight is None else (q, k, v, weight)
    got = torch.autograd.grad(out, leaves, upstream)
    want = torch.autograd.grad(expected, leaves, upstream)
    for got_grad, want_grad in zip(got, want, strict=True):
        assert relative_error(got_grad, want_grad) <= 1e-5


def test_chunked_takes_a_tensor_bias_and_returns_its_gradient():
    q, k, v = inputs(9, 11)
    bias = torch.randn(1, H, 9, 11, dtype=F64, requires_grad=True)
    out = chunked_attention(q, k, v, bias=bias, query_block=4, key_block=3)
    expected = attention_reference(q, k, v, bias)[0]
    assert relative_error(out, expected) <= 1e-5
    upstream = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, bias), upstream)
    want = torch.autograd.grad(expected, (q, bias), upstream)
    assert relative_error(got[0], want[0]) <= 1e-5 and relative_error(got[1], want[1]) <= 1e-5


def test_float32_chunked_is_within_float32_rounding_of_the_reference():
    q, k, v = (t.detach().float() for t in inputs(70, 70))
    out = chunked_attention(q, k, v, causal=True, query_block=16, key_block=24)
    expected = attention_reference(q, k, v, is_causal=True)[0]
    assert relative_error(out, expected) <= 1e-5  # float32: about 1e-7 per operation, a few dozen summed


def test_a_query_that_sees_no_key_gets_zero_and_finite_gradients():
    q, k, v = inputs(6, 6)
    padding = torch.ones(B, 6, dtype=torch.bool)
    padding[1, :3] = False  # left padding: causal rows 0..2 of row 1 see only padding
    out = chunked_attention(q, k, v, causal=True, key_padding_mask=padding, query_block=2, key_block=2)
    assert torch.equal(out[1, :, :3], torch.zeros_like(out[1, :, :3]))
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.equal(grads[0][1, :, :3], torch.zeros_like(grads[0][1, :, :3]))


class _LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an operation produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for item in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(item, torch.Tensor):
                self.largest = max(self.largest, item.numel())
        return result


def test_chunked_never_forms_a_query_by_key_matrix():
    length, block = 512, 64
    q, k, v = (torch.randn(1, 1, length, 16, requires_grad=True) for _ in range(3))
    alibi = ALiBi(1)
    positions = torch.arange(length)[None]

    def bias(qi, ki):
        return alibi(positions[:, qi], positions[:, ki])

    with _LargestTensor() as forward:
        out = chunked_attention(q, k, v, causal=True, bias=bias, query_block=block, key_block=block)
    with _LargestTensor() as backward:
        out.sum().backward()
    linear = max(block * block, length * 16)  # a block of scores, or a (T, Dh) input, output or gradient
    assert forward.largest <= linear and backward.largest <= linear  # length^2 is 32 times that
    with _LargestTensor() as dense:  # the check sees a quadratic kernel's matrix
        attention_reference(q, k, v, is_causal=True)
    assert dense.largest >= length * length


# ---- sliding window ---------------------------------------------------------------------------


def band_by_definition(tq, tk, window, causal):
    """Query i (at position i + tk - tq) sees key j: causal, i - W <= j <= i; else |i - j| <= W."""
    allowed = torch.zeros(tq, tk, dtype=torch.bool)
    for row in range(tq):
        i = row + tk - tq
        for j in range(tk):
            allowed[row, j] = (i - window <= j <= i) if causal else abs(i - j) <= window
    return allowed


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tq, tk, window, softcap", [(17, 17, 3, None), (17, 17, 1, None), (16, 16, 0, None),
                                                     (5, 14, 4, None), (9, 9, 20, None), (17, 17, 3, 0.7)])
def test_sliding_window_equals_reference_with_the_band_mask(causal, tq, tk, window, softcap):
    q, k, v = inputs(tq, tk, kv_heads=2)
    band = band_by_definition(tq, tk, window, causal)
    assert torch.equal(band_mask(tq, tk, window, causal=causal), band)
    out = chunked_attention(q, k, v, causal=causal, window=window, query_block=4, key_block=3, softcap=softcap)
    expected = reference(q, k, v, band[None, None], softcap=softcap)
    assert relative_error(out, expected) <= 1e-5
    upstream = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), upstream),
                         torch.autograd.grad(expected, (q, k, v), upstream), strict=True):
        assert relative_error(got, want) <= 1e-5


def _window_config(positional="learned", window=3, **fields):
    return tformer.PRESETS["gpt-nano"].replace(positional=positional, attention_kernel="sliding_window",
                                               attention_window=window, **fields)


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "relative"])
def test_cached_generation_with_a_rolling_window_equals_the_full_forward(positional):
    torch.manual_seed(0)
    model = build_model(_window_config(positional)).eval()
    ids = torch.randint(0, 64, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, :2] = 0  # a left-padded prompt
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        assert model.new_cache(2, 500)[0].self_attention.keys.shape[2] == 3 + REWIND_SLACK + RollingKVCache.HEADROOM
        assert model.new_cache(2, 40)[0].self_attention.keys.shape[2] == 40  # no more room than 40 positions need
        cache = model.new_cache(2, 16)
        assert all(isinstance(layer.self_attention, RollingKVCache) for layer in cache)
        assert cache[0].self_attention.keys.shape[2] == 3 + REWIND_SLACK  # the window and its slack at least
        steps = [model(ids[:, :7], attention_mask=mask[:, :7], cache=cache).logits]  # prefill longer than W
        steps.append(model(ids[:, 7:9], attention_mask=mask[:, :9], cache=cache).logits)  # a two-token step
        for t in range(9, 16):
            steps.append(model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], cache=cache).logits)
    real = mask.bool()
    assert (torch.cat(steps, 1) - full)[real].abs().max() <= 1e-5
    prompt, prompt_mask = ids[:, :6], mask[:, :6]
    assert torch.equal(tformer.generate(model, prompt, 10, attention_mask=prompt_mask),
                       tformer.generate(model, prompt, 10, attention_mask=prompt_mask, use_cache=False))


def test_a_rolling_cache_rewinds_only_while_it_still_holds_the_window():
    cache = RollingKVCache(1, 1, 5, 4, window=2)  # window 2, three positions of slack
    room = cache.keys.shape[2]
    assert room == 5 + RollingKVCache.HEADROOM
    cache.append(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4))
    cache.length = 1  # nothing forgotten yet: a rewind is exact
    cache.append(torch.randn(1, 1, room - 1, 4), torch.randn(1, 1, room - 1, 4))  # the buffer is full
    keys, _ = cache.append(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4))  # keeps the last 5, then adds one
    assert (cache.length, cache.held, cache.start, keys.shape[2]) == (room + 1, 6, room - 2, 3)  # sees W + itself
    cache.length = room - 2  # positions room - 5 .. room - 3 still hold the window of the next query
    assert (cache.held, cache.cached()[0].shape[2]) == (3, 3)
    with pytest.raises(ValueError, match=f"cannot go back to {room - 4} tokens and still see the 2 before them"):
        cache.length = room - 4


def test_a_rolling_cache_returns_what_each_step_sees_and_keeps_the_window():
    """Prompts shorter and longer than the buffer, then one-token steps past several moves to its front: every
    append returns the last W keys before the first new position and the new ones, and ``start`` indexes them."""
    cache = RollingKVCache(1, 2, 7, 3, window=4)
    sequence = torch.arange(400, dtype=torch.float32).view(1, 1, 400, 1).expand(1, 2, 400, 3)
    seen = 0
    for new in (150, 3, *[1] * 200, 40):
        keys, values = cache.append(sequence[:, :, seen:seen + new], -sequence[:, :, seen:seen + new])
        first = max(0, seen - 4)
        assert cache.start == first
        assert torch.equal(keys, sequence[:, :, first:seen + new]) and torch.equal(values, -keys)
        seen += new
        assert cache.length == seen and cache.held >= min(seen, 7)


def test_a_wider_window_than_the_sequence_is_full_attention():
    torch.manual_seed(0)
    config = tformer.PRESETS["gpt-nano"]
    dense = build_model(config).eval()
    windowed = build_model(config.replace(attention_kernel="sliding_window", attention_window=64)).eval()
    windowed.load_state_dict(dense.state_dict())
    ids = torch.randint(0, 64, (2, 30))
    with torch.no_grad():
        assert relative_error(windowed(ids).logits, dense(ids).logits) <= 1e-5


# ---- every family, every exact kernel ----------------------------------------------------------

EXACT = [{"attention_kernel": "reference"}, {"attention_kernel": "chunked"},
         {"attention_kernel": "sliding_window", "attention_window": 160}]


def _same_weights(config, **kernel):
    torch.manual_seed(0)
    base = build_model(config).eval()
    other = build_model(config.replace(**kernel)).eval()
    other.load_state_dict(base.state_dict())
    return base, other


@pytest.mark.parametrize("kernel", EXACT, ids=lambda k: k["attention_kernel"])
@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "relative"])
def test_decoder_gives_the_sdpa_logits_and_gradients_with_each_exact_kernel(kernel, positional):
    config = tformer.PRESETS["gpt-nano"].replace(positional=positional, max_seq_len=160, num_kv_heads=2)
    base, other = _same_weights(config, **kernel)
    ids = torch.randint(0, 64, (2, 140))  # longer than one 128-position block
    mask = torch.ones(2, 140, dtype=torch.long)
    mask[1, :5] = 0
    labels = ids.clone()
    labels[1, :6] = -100  # what padding rows predict (they see no key: 0 here, uniform weights on sdpa)
    want, got = base(ids, attention_mask=mask, labels=labels), other(ids, attention_mask=mask, labels=labels)
    real = mask.bool()
    assert relative_error(got.logits[real], want.logits[real]) <= 1e-5
    want.loss.backward()
    got.loss.backward()
    for (name, p), q in zip(base.named_parameters(), other.parameters(), strict=True):
        assert relative_error(q.grad, p.grad) <= 1e-4, name  # float32 gradients summed over 140 x 140 pairs


@pytest.mark.parametrize("kernel", EXACT, ids=lambda k: k["attention_kernel"])
@pytest.mark.parametrize("positional", ["learned", "relative"])
def test_encoder_gives_the_sdpa_logits_with_each_exact_kernel(kernel, positional):
    config = tformer.PRESETS["bert-tiny"].replace(vocab_size=100, max_seq_len=160, d_model=32, num_heads=4,
                                                  attention_dropout=0.0, positional=positional)
    base, other = _same_weights(config, **kernel)
    ids = torch.randint(0, 100, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 13:] = 0
    with torch.no_grad():
        want, got = base(ids, attention_mask=mask), other(ids, attention_mask=mask)
    assert relative_error(got.logits[mask.bool()], want.logits[mask.bool()]) <= 1e-5


@pytest.mark.parametrize("kernel", [*EXACT[:2], {"attention_kernel": "sliding_window", "attention_window": 17}],
                         ids=lambda k: k["attention_kernel"])
def test_vision_gives_the_sdpa_logits_with_each_exact_kernel(kernel):
    config = ModelConfig(architecture="vision", d_model=32, num_layers=2, num_heads=4, activation="gelu",
                         image_size=16, patch_size=4, head="image_classification", num_labels=5)
    base, other = _same_weights(config, **kernel)
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert relative_error(other(pixels).logits, base(pixels).logits) <= 1e-5


def test_a_narrow_window_changes_a_vision_model():
    config = ModelConfig(architecture="vision", d_model=32, num_layers=2, num_heads=4, activation="gelu",
                         image_size=16, patch_size=4, head="image_classification", num_labels=5)
    base, windowed = _same_weights(config, attention_kernel="sliding_window", attention_window=2)
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert relative_error(windowed(pixels).logits, base(pixels).logits) > 1e-3


# ---- attention weights ---------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", EXACT[1:], ids=lambda k: k["attention_kernel"])
def test_chunked_kernels_return_the_reference_weights_when_asked(kernel):
    config = tformer.PRESETS["gpt-nano"].replace(positional="alibi", max_seq_len=160)
    base, other = _same_weights(config, **kernel)
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        want, got = base(ids, output_attentions=True), other(ids, output_attentions=True)
    for a, b in zip(got.attentions, want.attentions, strict=True):
        assert a.shape == (2, 4, 12, 12) and relative_error(a, b) <= 1e-5


def test_sliding_window_weights_are_zero_outside_the_band():
    model = build_model(_window_config(window=2)).eval()
    with torch.no_grad():
        weights = model(torch.randint(0, 64, (1, 9)), output_attentions=True).attentions[0]
    outside = ~band_mask(9, 9, 2, causal=True)
    assert torch.equal(weights[..., outside], torch.zeros_like(weights[..., outside]))
    assert torch.allclose(weights.sum(-1), torch.ones(1, 4, 9))


def test_a_query_the_band_and_the_padding_leave_blind_gets_zero_weights_and_output():
    """Bidirectional, W = 1: the last query sees keys 17 and 18, both padding; its one real key (16) is outside the
    band, so it sees nothing: zeros, as every kernel gives such a row (it had uniform weights on the masked keys)."""
    kernel = kernel_class("sliding_window")(DH, attention_window=1)
    q, k, v = (tensor.detach().float() for tensor in inputs(1, 19))
    padding = torch.zeros(B, 19, dtype=torch.bool)
    padding[:, 16] = True
    out, weights = kernel(q, k, v, AttentionMask(False, padding), need_weights=True)
    assert torch.equal(weights, torch.zeros_like(weights)) and torch.equal(out, torch.zeros_like(out))
    assert torch.equal(kernel(q, k, v, AttentionMask(False, padding))[0], out)


# ---- fail closed ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", [{"attention_kernel": "reference"}, {"attention_kernel": "chunked"},
                                    {"attention_kernel": "sliding_window", "attention_window": 4},
                                    {"attention_kernel": "performer", "performer_features": 16}],
                         ids=lambda kernel: kernel["attention_kernel"])
def test_every_kernel_decodes_on_the_stack_path(kernel):
    model = build_model(tformer.PRESETS["gpt-nano"].replace(**kernel)).eval()
    session, _ = open_session(model, torch.randint(0, 64, (1, 5)), None, 4)
    assert isinstance(session, StackSession)


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_hugging_face_export_takes_exact_kernels_and_refuses_a_window(tmp_path, model_type):
    family = family_for_model_type(model_type)
    config = tformer.PRESETS["gpt-nano"] if model_type == "gpt2" else tformer.PRESETS["llama-small"].replace(
        vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=64)
    for exact in ("reference", "chunked"):
        assert family.mismatches(config.replace(attention_kernel=exact)) == []
    windowed = config.replace(attention_kernel="sliding_window", attention_window=8)
    assert family.mismatches(windowed)[-2:] == [
        f"attention_kernel='sliding_window' (needs 'sdpa' or 'reference' or 'chunked' or 'flex': {model_type} "
        "computes exact softmax attention)",
        f"attention_window=8 (needs 0: not a {model_type} setting)",
    ]
    if model_type == "gpt2":
        with pytest.raises(CheckpointError, match="attention_kernel='sliding_window'"):
            build_model(windowed).save(tmp_path / "out", format="hf")
        assert not (tmp_path / "out").exists()
        build_model(config.replace(attention_kernel="chunked")).save(tmp_path / "chunked", format="hf")
        assert tformer.load(tmp_path / "chunked").config.attention_kernel == "sdpa"


def test_module_refuses_dropout_and_a_window_it_cannot_use():
    with pytest.raises(ValueError, match="kernel='chunked' has no attention dropout"):
        MultiHeadAttention(16, 2, dropout=0.1, kernel="chunked")
    with pytest.raises(ValueError, match="'chunked' reads no settings; got attention_window"):
        MultiHeadAttention(16, 2, kernel="chunked", kernel_settings={"attention_window": 3})
    with pytest.raises(ValueError, match="attention kernel 'flash' is not one of sdpa, reference"):
        MultiHeadAttention(16, 2, kernel="flash")
    with pytest.raises(ValueError, match=r"^attention_kernel='sdpa' does not support attention_softcap=50\.0$"):
        MultiHeadAttention(16, 2, softcap=50.0)
    with pytest.raises(ValueError, match=r"attention_kernel='performer' does not support a scale of 0\.25"):
        MultiHeadAttention(16, 2, kernel="performer", scale=0.25)


# ---- Performer wiring (tformer.nn.favor comes from the Performer branch) ----------------------


def _performer_model(**fields):
    pytest.importorskip("tformer.nn.favor", reason="tformer.nn.favor is written on the Performer branch")
    config = tformer.PRESETS["gpt-nano"].replace(attention_kernel="performer", performer_features=32, **fields)
    return build_model(config).eval()


def test_each_performer_layer_owns_its_projection():
    model = _performer_model()
    from tformer.nn.favor import PerformerProjection

    projections = [block.attention.performer for block in model.stack.blocks]
    assert all(isinstance(p, PerformerProjection) for p in projections)
    assert projections[0].projection.shape == (32, model.config.head_dim)
    assert any(name.endswith("performer.projection") for name in model.state_dict())


def test_performer_refuses_attention_weights():
    model = _performer_model()
    with pytest.raises(ValueError, match="attention_kernel='performer' has no attention weights"):
        model(torch.randint(0, 64, (1, 5)), output_attentions=True)


def test_performer_cached_generation_equals_the_full_forward():
    torch.manual_seed(0)
    model = _performer_model(positional="rope")
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(2, 12)
        steps = [model(ids[:, :5], cache=cache).logits]
        size = cache[0].self_attention.nbytes()
        steps += [model(ids[:, t:t + 1], cache=cache).logits for t in range(5, 12)]
    assert relative_error(torch.cat(steps, 1), full) <= 1e-5
    assert cache[0].self_attention.nbytes() == size  # its running sums, not the keys: it never grows


def test_performer_decoding_cannot_rewind_so_speculative_decoding_is_refused():
    model = _performer_model()
    with pytest.raises(GenerationError, match="cannot forget"):
        tformer.generate(model, torch.randint(0, 64, (1, 5)), 4, draft_model=model)


def test_performer_export_is_refused(tmp_path):
    model = _performer_model()
    with pytest.raises(CheckpointError, match="attention_kernel='performer'"):
        model.save(tmp_path / "out", format="hf")
