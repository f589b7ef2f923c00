"""The ``flex`` kernel (PyTorch's FlexAttention) equals attention by its definition under every part of a pass's
mask: causality over the last queries of a longer context, padding with blind rows, packed examples, sliding
windows, ALiBi and T5's relative biases, soft-capping, another scale, grouped key/value heads. On the CPU forward
only (FlexAttention has no backward pass there, and training with it is refused there); outputs and gradients on
CUDA when a GPU is present. The kernels that send passes to it on a GPU (``gpu_flex``) give their own results
when made to route on the CPU."""

import math

import pytest
import torch

import tformer
from tformer.nn.attention import AttentionMask, flex, kernel_class
from tformer.nn.attention import chunked as chunked_module
from tformer.nn.attention import sdpa as sdpa_module
from tformer.nn.positions import ALiBi, RelativePositionBias
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.tasks import LanguageModelling
from tformer.training.trainer import Trainer

B, H, DH = 2, 4, 16
TOLERANCE = 1e-5  # float32 against a float64 definition: tens of roundings of ~6e-8 each; one key wrongly seen or
# missed moves the output by percent


def by_definition(q, k, v, allowed, bias=None, scale=None, softcap=None):
    """Softmax attention in float64: ``allowed`` (B|1, 1, Tq, Tk) True = seen, rows that see nothing give 0."""
    q, k, v = (t.double() for t in (q, k, v))
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = q @ k.transpose(-2, -1) * (scale or 1 / math.sqrt(q.shape[-1]))
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias.double()
    scores = scores.masked_fill(~allowed, -math.inf)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v


def allowed_keys(q_len, k_len, causal=False, padding=None, segments=None, window=None):
    """What each of the last ``q_len`` queries of ``k_len`` positions sees, (B|1, 1, Tq, Tk)."""
    positions = torch.arange(k_len - q_len, k_len)[:, None]
    keys = torch.arange(k_len)[None, :]
    allowed = (keys <= positions) if causal and q_len > 1 else torch.ones(q_len, k_len, dtype=torch.bool)
    if window is not None:
        allowed = allowed & (positions - keys <= window) & ((keys - positions <= window) | causal)
    allowed = allowed[None, None]
    if padding is not None:
        allowed = allowed & padding[:, None, None, :]
    if segments is not None:
        allowed = allowed & (segments[:, None, k_len - q_len:, None] == segments[:, None, None, :])
    return allowed


def tensors(q_len, k_len, kv_heads=H, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, q_len, DH, generator=generator), torch.randn(B, kv_heads, k_len, DH, generator=generator),
            torch.randn(B, kv_heads, k_len, DH, generator=generator))


def relative_error(got, expected):
    return ((got.double() - expected).norm() / expected.norm()).item()


PADDING = torch.tensor([[True] * 13, [False] * 5 + [True] * 8])  # row 1 left-padded: its first queries see nothing
SEGMENTS = torch.tensor([[0] * 5 + [1] * 8, [0] * 9 + [1] * 4])  # two examples packed into each row


def alibi(q_len, k_len):
    positions = torch.arange(k_len)[None]
    return ALiBi(H), positions[:, k_len - q_len:], positions


def relative(q_len, k_len, bidirectional):
    torch.manual_seed(0)
    positions = torch.arange(k_len)[None]
    return RelativePositionBias(H, bidirectional, num_buckets=8, max_distance=16), positions[:, k_len - q_len:], \
        positions


# name: (Tq, Tk, kv heads, causal, padding, segments, window, bias maker)
CASES = {
    "plain": (13, 13, H, False, None, None, None, None),
    "causal": (13, 13, H, True, None, None, None, None),
    "causal+left-padding": (13, 13, H, True, PADDING, None, None, None),
    "cross+padding": (5, 13, H, False, PADDING, None, None, None),
    "continuing-a-cache": (4, 13, H, True, None, None, None, None),
    "one-query-decoding": (1, 13, 2, True, PADDING, None, None, None),
    "gqa": (13, 13, 2, True, None, None, None, None),
    "packed-examples": (13, 13, H, True, None, SEGMENTS, None, None),
    "window-causal": (13, 13, H, True, None, None, 3, None),
    "window-bidirectional": (13, 13, H, False, PADDING, None, 2, None),
    "alibi": (13, 13, 2, True, None, None, None, alibi),
    "relative-causal": (13, 13, H, True, PADDING, None, None, lambda q, k: relative(q, k, False)),
    "relative-bidirectional": (13, 13, H, False, PADDING, None, None, lambda q, k: relative(q, k, True)),
}


def case_inputs(name):
    q_len, k_len, kv_heads, causal, padding, segments, window, bias_maker = CASES[name]
    q, k, v = tensors(q_len, k_len, kv_heads)
    mask, bias = AttentionMask(causal, padding, segments=segments), None
    if bias_maker is not None:
        module, query_positions, key_positions = bias_maker(q_len, k_len)
        mask = AttentionMask(causal, padding, query_positions, key_positions, module, segments=segments)
        with torch.no_grad():
            bias = module(query_positions, key_positions)
    return q, k, v, mask, window, allowed_keys(q_len, k_len, causal, padding, segments, window), bias


@pytest.mark.parametrize("softcap", [None, 0.7], ids=["", "softcap"])  # 0.7: most scores deep in the tanh's bend
@pytest.mark.parametrize("name", list(CASES))
def test_flex_equals_the_definition_under_every_mask(name, softcap):
    q, k, v, mask, window, allowed, bias = case_inputs(name)
    with torch.no_grad():
        out = flex.flex_attend(q, k, v, mask, softcap=softcap, window=window)
    assert out.dtype == torch.float32
    assert relative_error(out, by_definition(q, k, v, allowed, bias, softcap=softcap)) <= TOLERANCE
    if (~allowed.any(-1)).any():  # a blind query gets zeros, as from every kernel
        assert torch.all(out.masked_select(~allowed.any(-1, keepdim=True).expand(out.shape)) == 0)


def test_the_flex_kernel_scales_caps_and_returns_the_reference_weights():
    q, k, v, mask, _, allowed, _ = case_inputs("causal+left-padding")
    kernel = kernel_class("flex")(DH, scale=0.3, softcap=2.0)
    out, none = kernel(q, k, v, mask)
    assert none is None
    assert relative_error(out, by_definition(q, k, v, allowed, scale=0.3, softcap=2.0)) <= TOLERANCE
    _, weights = kernel(q, k, v, mask, need_weights=True)
    assert torch.all(weights.masked_select(~allowed.expand(weights.shape)) == 0)


def test_the_block_mask_and_score_function_are_made_once_per_pass():
    q, k, v, mask, *_ = case_inputs("relative-causal")
    with torch.no_grad():
        first = flex.flex_attend(q, k, v, mask)
        made = dict(mask._derived)
        again = flex.flex_attend(q, k, v, mask)  # the next layer of the pass
    assert torch.equal(first, again) and mask._derived.keys() == made.keys()
    assert all(mask._derived[key] is made[key] for key in made)


def test_flex_refuses_a_gradient_on_the_cpu_and_training_is_refused_before_a_step():
    q, k, v, mask, *_ = case_inputs("causal")
    q.requires_grad_()
    with pytest.raises(ValueError, match="'flex' has no backward pass on the CPU"):
        flex.flex_attend(q, k, v, mask)
    with torch.no_grad():  # a forward without gradients takes inputs that could have them
        flex.flex_attend(q, k, v, mask)
    model = tformer.build_model("gpt-nano", vocab_size=16, max_seq_len=16, attention_kernel="flex")
    tokens = torch.randint(0, 16, (200,))
    with pytest.raises(TrainingError, match=r"attention_kernel='flex' has no backward pass on the CPU: train with "
                                            r"'sdpa' here"):
        Trainer(model, TrainingConfig(max_steps=1, batch_size=2, seq_len=16, device="cpu"),
                LanguageModelling(tokens), progress=False)


@pytest.mark.parametrize("positional", ["learned", "alibi", "relative"])
def test_a_flex_decoder_gives_the_sdpa_logits_and_tokens(positional):
    config = tformer.PRESETS["gpt-nano"].replace(positional=positional, vocab_size=64, max_seq_len=48,
                                                 num_kv_heads=2)
    torch.manual_seed(0)
    sdpa_model = tformer.build_model(config).eval()
    flex_model = tformer.build_model(config.replace(attention_kernel="flex")).eval()
    flex_model.load_state_dict(sdpa_model.state_dict())
    ids = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # left padding: blind rows
    with torch.no_grad():
        expected, got = sdpa_model(ids, attention_mask=mask).logits, flex_model(ids, attention_mask=mask).logits
    real = mask.bool()
    assert relative_error(got[real], expected[real].double()) <= TOLERANCE
    prompt = ids[:1, :8]
    assert torch.equal(tformer.generate(flex_model, prompt, 12, eos_token_id=[]),
                       tformer.generate(sdpa_model, prompt, 12, eos_token_id=[]))


def test_on_a_gpu_only_passes_sdpa_cannot_take_natively_route_to_flex():
    mask = AttentionMask(True, PADDING)
    cpu = torch.zeros(1, 1, 1, DH)
    assert not flex.routes_to_flex(kernel_class("sdpa")(DH), cpu, AttentionMask(True, PADDING, segments=SEGMENTS))
    assert not flex.needs_flex(mask) and not flex.needs_flex(AttentionMask(True))
    assert flex.needs_flex(AttentionMask(True, segments=SEGMENTS))
    assert flex.needs_flex(mask, softcap=1.0) and flex.needs_flex(mask, window=4)
    module, query_positions, key_positions = alibi(4, 4)
    assert flex.needs_flex(AttentionMask(True, None, query_positions, key_positions, module))
    assert kernel_class("sdpa").gpu_flex and kernel_class("sliding_window").gpu_flex
    assert not kernel_class("reference").gpu_flex and not kernel_class("performer").gpu_flex


@pytest.mark.parametrize("setting", [dict(positional="alibi"), dict(positional="relative"),
                                     dict(attention_kernel="sliding_window", attention_window=5),
                                     dict(attention_kernel="chunked", attention_softcap=3.0)],
                         ids=["sdpa-alibi", "sdpa-relative", "sliding-window", "chunked-softcap"])
def test_the_routed_kernels_give_their_own_results_through_flex(monkeypatch, setting):
    """What a GPU does with these passes, done on the CPU by making the kernels route: the same logits."""
    torch.manual_seed(0)
    model = tformer.build_model(tformer.PRESETS["gpt-nano"].replace(vocab_size=64, max_seq_len=40, **setting)).eval()
    ids = torch.randint(0, 64, (2, 33), generator=torch.Generator().manual_seed(2))  # past one 32-key block
    with torch.no_grad():
        expected = model(ids).logits
        calls = []

        def route(kernel, q, mask, softcap=None, window=None):
            calls.append(kernel.gpu_flex and flex.needs_flex(mask, softcap, window))
            return calls[-1]

        monkeypatch.setattr(sdpa_module, "routes_to_flex", route)
        monkeypatch.setattr(chunked_module, "routes_to_flex", route)
        routed = model(ids).logits
    assert any(calls)
    assert relative_error(routed, expected.double()) <= TOLERANCE


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine: the suite runs "
                                                                "without one")


@CUDA
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_on_cuda_flex_outputs_and_gradients_equal_the_definition(name, dtype, tolerance):
    q, k, v, mask, window, allowed, bias = case_inputs(name)
    device = torch.device("cuda")
    leaves = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
    on_device = AttentionMask(mask.causal, None if mask.key_padding is None else mask.key_padding.to(device),
                              None if mask.query_positions is None else mask.query_positions.to(device),
                              None if mask.key_positions is None else mask.key_positions.to(device),
                              None if mask.position_bias is None else mask.position_bias.to(device),
                              segments=None if mask.segments is None else mask.segments.to(device))
    out = flex.flex_attend(*leaves, on_device, window=window)
    reference = [t.double().requires_grad_() for t in (q, k, v)]
    expected = by_definition(*reference, allowed, bias)
    assert relative_error(out.float().cpu(), expected.detach()) <= tolerance
    direction = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (out.float() * direction.to(device)).sum().backward()
    (expected * direction.double()).sum().backward()
    for got, want in zip(leaves, reference, strict=True):
        assert relative_error(got.grad.float().cpu(), want.grad) <= 10 * tolerance
