"""The compiled one-query decode attention over a dense cache (``nn/kernels/dense_decode.cpp``), which the sdpa
kernel runs for decoding steps of many sequences on the CPU: equal to PyTorch's attention on the same inputs
(cache views, padding, position biases, grouped heads, rows that see no key), and beam search giving the same
translations with it as without it."""

import pytest
import torch
import torch.nn.functional as F

import tformer
from tformer.nn import compiled
from tformer.nn.attention import sdpa
from tformer.nn.attention.mask import additive_mask

KERNELS = compiled.load_or_none()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="the compiled kernels do not build here")
NO_MASK = torch.empty(0)


def cache_views(batch, kv_heads, length, head_dim, capacity=40, seed=0):
    """Keys and values as a decoding cache holds them: the filled part of a longer buffer (B, Hkv, T, Dh)."""
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(batch, kv_heads, capacity, head_dim, generator=generator)
    values = torch.randn(batch, kv_heads, capacity, head_dim, generator=generator)
    return keys[:, :, :length], values[:, :, :length]


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(4, 4, 16), (8, 2, 32), (6, 1, 24)])
@pytest.mark.parametrize("length", [1, 7, 33])
def test_equals_pytorch_attention_with_and_without_a_padding_mask(heads, kv_heads, head_dim, length):
    keys, values = cache_views(5, kv_heads, length, head_dim)
    queries = torch.randn(5, heads, 1, head_dim)
    grouped = heads != kv_heads
    got = KERNELS.dense_decode(queries, keys, values, NO_MASK, head_dim ** -0.5)
    want = F.scaled_dot_product_attention(queries, keys, values, enable_gqa=grouped)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    visible = torch.rand(5, length, generator=torch.Generator().manual_seed(1)) > 0.4
    visible[:, -1] = True
    mask = additive_mask(visible[:, None, None, :], torch.float32)  # (B, 1, 1, T)
    got = KERNELS.dense_decode(queries, keys, values, mask, head_dim ** -0.5)
    want = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, enable_gqa=grouped)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_position_bias_per_head_is_added_and_a_row_that_sees_nothing_gets_zeros():
    keys, values = cache_views(3, 4, 9, 16)
    queries = torch.randn(3, 4, 1, 16)
    bias = torch.randn(3, 4, 1, 9)  # (B, H, 1, T): T5's relative buckets, ALiBi
    got = KERNELS.dense_decode(queries, keys, values, bias, 0.25)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias),
                               rtol=1e-5, atol=1e-6)
    hidden = torch.ones(3, 9, dtype=torch.bool)
    hidden[1] = False  # sequence 1 sees no key
    got = KERNELS.dense_decode(queries, keys, values, additive_mask(hidden[:, None, None, :], torch.float32), 0.25)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    torch.testing.assert_close(got[0], F.scaled_dot_product_attention(queries, keys, values)[0], rtol=1e-5, atol=1e-6)


def test_the_sdpa_kernel_takes_it_only_for_many_sequences_without_gradients():
    queries = torch.randn(64, 4, 1, 16)
    keys, values = cache_views(64, 4, 12, 16)
    assert sdpa._many_sequences_decoding(queries, keys, values)
    assert not sdpa._many_sequences_decoding(queries[:1], keys[:1], values[:1])  # batch-1: PyTorch's kernel
    assert not sdpa._many_sequences_decoding(queries.requires_grad_(), keys, values)  # training: autograd's
    assert not sdpa._many_sequences_decoding(queries.detach().double(), keys.double(), values.double())


@torch.no_grad()
@pytest.mark.parametrize("num_beams", [1, 4])
def test_decoding_translates_the_same_with_the_compiled_decode_as_without(monkeypatch, num_beams):
    torch.manual_seed(0)
    model = tformer.build_model("transformer-multi30k", vocab_size=64, num_layers=2, d_model=64, num_heads=4,
                                d_ff=128).eval()
    sources = torch.randint(4, 64, (16, 9))
    attention_mask = torch.ones_like(sources)
    attention_mask[3:, 7:] = 0  # padded sources: cross-attention masks
    options = {"attention_mask": attention_mask, "max_new_tokens": 12, "num_beams": num_beams}
    monkeypatch.setattr(sdpa, "PAIRS_PER_THREAD", 0)  # the compiled decode at every step, whatever the threads
    calls = []

    class Counting:  # the kernels, counting the decode steps they serve
        def dense_decode(self, *args):
            calls.append(1)
            return KERNELS.dense_decode(*args)

    monkeypatch.setattr(compiled, "load_or_none", Counting)
    with_kernel = tformer.generate(model, sources, **options)
    # Every step after the first: self-attention of both layers, and greedy's cross-attention (beams share their
    # source's keys, so beam search's cross-attention reads them as one block of queries: PyTorch's kernel).
    assert len(calls) >= (2 if num_beams > 1 else 4) * 11
    monkeypatch.setattr(compiled, "load_or_none", lambda: None)
    assert torch.equal(with_kernel, tformer.generate(model, sources, **options))
