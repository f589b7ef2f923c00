"""The in-place paged decode readers (the C++ kernel; FlexAttention, a GPU's, run unfused here): softmax
attention over each sequence's pool rows, read where they are, equal to PyTorch's own attention over the same
keys gathered; which models they serve, and the engine decoding the same tokens with them as with the gather."""

import os

import pytest
import torch
import torch.nn.functional as F

import tformer
from tformer.generation import GenerationConfig, GenerationError
from tformer.nn.attention.paged_kernel import (
    READERS,
    TILE,
    PagedKernelError,
    flex_paged_decode,
    load,
    paged_block_mask,
    paged_decode,
    resolve,
)
from tformer.serving import Engine

try:
    load()
except PagedKernelError as error:  # a machine without a C++ compiler: the engine gathers (tested below)
    pytest.skip(f"the in-place kernel cannot be built here: {error}", allow_module_level=True)


def pool_and_contexts(lengths, kv_heads, head_dim, dtype, block_size=4, seed=0, spare=3):
    """A pool with every sequence's tokens in blocks scattered through it, as the engine hands them out, and
    ``spare`` blocks nobody uses."""
    generator = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-length // block_size) for length in lengths]
    order = torch.randperm(sum(blocks_needed) + spare, generator=generator)
    slots = len(order) * block_size
    keys = torch.randn(slots, kv_heads, head_dim, generator=generator).to(dtype)
    values = torch.randn(slots, kv_heads, head_dim, generator=generator).to(dtype)
    contexts, taken = [], 0
    for length, count in zip(lengths, blocks_needed, strict=True):
        blocks = order[taken:taken + count]
        taken += count
        rows = (blocks[:, None] * block_size + torch.arange(block_size)).reshape(-1)[:length]
        contexts.append(rows)
    return keys, values, contexts


def gathered_reference(queries, keys, values, contexts):
    """PyTorch's attention of each sequence alone over its gathered keys, in float64."""
    out = []
    for index, rows in enumerate(contexts):
        q = queries[index].double()[None, :, None]  # (1, H, 1, Dh)
        k = keys[rows].double().transpose(0, 1)[None]  # (1, Hkv, L, Dh)
        v = values[rows].double().transpose(0, 1)[None]
        out.append(F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])[0, :, 0])
    return torch.stack(out)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(4, 4, 16), (6, 2, 24), (6, 3, 40), (8, 1, 64)])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-6), (torch.float64, 1e-12), (torch.bfloat16, 2e-2)])
def test_equals_attention_over_the_gathered_keys(heads, kv_heads, head_dim, dtype, tolerance):
    lengths = [1, 7, 33, 4, 16, 120]
    keys, values, contexts = pool_and_contexts(lengths, kv_heads, head_dim, dtype)
    queries = (torch.randn(len(lengths), heads, head_dim, generator=torch.Generator().manual_seed(1)) * 2).to(dtype)
    offsets = torch.tensor([0] + lengths).cumsum(0)
    got = paged_decode(queries, keys, values, torch.cat(contexts), offsets)
    assert got.dtype == dtype and got.shape == queries.shape
    torch.testing.assert_close(got.double(), gathered_reference(queries, keys, values, contexts),
                               rtol=tolerance, atol=tolerance)


def test_large_scores_stay_finite():
    keys, values, contexts = pool_and_contexts([50, 3], 2, 8, torch.float32)
    queries = torch.randn(2, 2, 8) * 200  # scores in the thousands: the max is subtracted before exp
    got = paged_decode(queries, keys * 50, values, torch.cat(contexts), torch.tensor([0, 50, 53]))
    torch.testing.assert_close(got.double(), gathered_reference(queries, keys * 50, values, contexts),
                               rtol=1e-4, atol=1e-4)


def test_a_row_outside_the_pool_is_refused():
    keys, values, _ = pool_and_contexts([4], 2, 8, torch.float32)
    with pytest.raises(RuntimeError, match="outside the pool"):
        paged_decode(torch.randn(1, 2, 8), keys, values, torch.tensor([0, 1, 2, len(keys)]), torch.tensor([0, 4]))
    with pytest.raises(RuntimeError, match="offsets"):
        paged_decode(torch.randn(1, 2, 8), keys, values, torch.tensor([0, 1, 2, 3]), torch.tensor([0, 3]))


def shared_prefix_contexts(lengths, block_size, kv_heads, head_dim):
    """A pool of 40 blocks (5 of FlexAttention's tiles at block size 16) with scattered sequences, and one more
    that shares the first two full blocks of the longest and then writes its own: as prefix caching hands them."""
    keys, values, contexts = pool_and_contexts(lengths, kv_heads, head_dim, torch.float32, block_size=block_size,
                                               spare=40 - sum(-(-length // block_size) for length in lengths))
    longest = max(contexts, key=len)
    free = sorted(set(range(40)) - {int(slot) // block_size for rows in contexts for slot in rows})
    own = (free[0] * block_size + torch.arange(5))  # 5 tokens of its own in a block nobody else holds
    return keys, values, [*contexts, torch.cat([longest[:2 * block_size], own])]


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(4, 4, 16), (6, 2, 24), (8, 1, 64)])
def test_flex_reads_each_sequence_s_rows_where_they_are(heads, kv_heads, head_dim):
    """FlexAttention over the whole pool under the step's block mask (a GPU's reader, unfused on the CPU) equals
    attention over each sequence's keys gathered, a sequence sharing another's prefix blocks included."""
    keys, values, contexts = shared_prefix_contexts([3, 70, 129, 17, 1], 16, kv_heads, head_dim)
    queries = torch.randn(len(contexts), heads, head_dim, generator=torch.Generator().manual_seed(1)) * 2
    offsets = torch.tensor([0] + [len(rows) for rows in contexts]).cumsum(0)
    block_mask = paged_block_mask(torch.cat(contexts), offsets, 16, keys.shape[0])
    got = flex_paged_decode(queries, keys, values, block_mask)
    assert got.shape == queries.shape
    torch.testing.assert_close(got.double(), gathered_reference(queries, keys, values, contexts),
                               rtol=1e-5, atol=1e-5)


def test_the_flex_mask_lists_exactly_the_tiles_a_sequence_reads():
    """The block mask's sparse part (what a GPU's fused kernel skips by) names each sequence's tiles, no other."""
    keys, _, contexts = shared_prefix_contexts([3, 70, 129, 17, 1], 16, 2, 8)
    assert keys.shape[0] == 40 * 16 and keys.shape[0] > 4 * TILE
    offsets = torch.tensor([0] + [len(rows) for rows in contexts]).cumsum(0)
    block_mask = paged_block_mask(torch.cat(contexts), offsets, 16, keys.shape[0])
    dense = block_mask.to_dense()[:, 0, 0]  # (B, tiles): 1 where the kernel visits the tile
    for index, rows in enumerate(contexts):
        expected = torch.zeros(dense.shape[1], dtype=dense.dtype)
        expected[rows // TILE] = 1
        assert torch.equal(dense[index], expected), index
    assert 0 < dense.sum() < dense.numel()  # sparse: the test's pool spreads the sequences over the tiles


def small_model(**overrides):
    settings = dict(vocab_size=53, max_seq_len=128, d_model=48, num_layers=2, num_heads=6, num_kv_heads=2,
                    positional="rope", initializer_range=0.2)
    settings.update(overrides)
    torch.manual_seed(0)
    return tformer.build_model("gpt-nano", **settings).eval()


def test_the_engine_decodes_the_same_tokens_in_place_as_by_gathering():
    model = small_model()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 53, (length,), generator=generator).tolist() for length in (1, 9, 30, 4, 17, 2)]
    config = GenerationConfig(max_new_tokens=24, eos_token_id=())
    in_place = Engine(model, cache_tokens=512, block_size=4, max_running=6, max_step_tokens=20)
    gather = Engine(model, cache_tokens=512, block_size=4, max_running=6, max_step_tokens=20, paged_attention="gather")
    assert in_place.in_place and not gather.in_place
    # max_step_tokens=20 admits the prompts over several steps: steps mix prefills and in-place decodes.
    assert [r.outputs() for r in in_place.complete(prompts, config)] == [r.outputs() for r in
                                                                          gather.complete(prompts, config)]
    for prompt, request in zip(prompts, in_place.complete(prompts, config), strict=True):
        alone = tformer.generate(model, torch.tensor([prompt]), generation_config=config)[0, len(prompt):]
        assert request.outputs()[0] == alone.tolist()
    assert in_place.pool.blocks_in_use == 0


def test_the_engine_reads_the_pool_through_flex_attention_as_by_gathering(monkeypatch):
    """The GPU's reader asked for by name (here on the CPU, unfused): the gather's tokens, with prompts that share
    prefix blocks and steps that mix prefills with in-place decodes; ``auto`` gathers where FlexAttention reads."""
    monkeypatch.setitem(READERS, "cpu", "flex")
    model = small_model()
    assert resolve("auto", model)[0] is None and "captured" in resolve("auto", model)[1]
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 53, (12,), generator=generator).tolist()
    prompts = [prefix + torch.randint(0, 53, (length,), generator=generator).tolist() for length in (1, 9, 3)]
    prompts += [torch.randint(0, 53, (length,), generator=generator).tolist() for length in (30, 2)]
    config = GenerationConfig(max_new_tokens=20, eos_token_id=())
    flex = Engine(model, cache_tokens=1024, block_size=4, max_running=6, max_step_tokens=20,
                  paged_attention="in-place")
    gather = Engine(model, cache_tokens=1024, block_size=4, max_running=6, max_step_tokens=20,
                    paged_attention="gather")
    assert flex.in_place == "flex" and "FlexAttention" in flex.paged_attention_note and flex.prefix_caching
    assert [r.outputs() for r in flex.complete(prompts, config)] == [r.outputs() for r in
                                                                      gather.complete(prompts, config)]
    assert flex.complete(prompts[:1], config)[0].outputs() == gather.complete(prompts[:1], config)[0].outputs()
    assert flex.stats.prefix_cache_hit_tokens > 0  # the second call's prompt read its prefix blocks from the cache


@pytest.mark.parametrize("overrides, named", [
    (dict(attention_kernel="sliding_window", attention_window=8), "attention_kernel='sliding_window'"),
    (dict(positional="alibi"), "positional='alibi'"),
])
def test_a_model_it_cannot_serve_gathers_or_is_refused(overrides, named):
    model = small_model(**overrides)
    in_place, note = resolve("auto", model)
    assert not in_place and named in note and note.startswith("paged attention: gather")
    engine = Engine(model, cache_tokens=256, block_size=4)
    assert not engine.in_place and named in engine.paged_attention_note
    with pytest.raises(GenerationError, match=f"paged_attention='in-place' cannot serve this model: .*{named}"):
        Engine(model, cache_tokens=256, paged_attention="in-place")


def test_an_unknown_mode_is_refused():
    with pytest.raises(GenerationError, match="paged_attention='fast' must be one of auto, in-place, gather"):
        Engine(small_model(), cache_tokens=256, paged_attention="fast")


@pytest.mark.slow  # a fresh interpreter without the compiled kernels
def test_without_the_compiled_kernels_the_engine_gathers_and_performer_uses_tensor_operations():
    """TFORMER_COMPILED_KERNELS=0 (as on a machine without a C++ compiler): "auto" gathers and says why,
    "in-place" is refused, and decoding still equals generate."""
    import subprocess
    import sys

    script = """
import torch, tformer
from tformer.serving import Engine
from tformer.generation import GenerationConfig, GenerationError
from tformer.nn.compiled import load_or_none
torch.manual_seed(0)
model = tformer.build_model("gpt-nano", vocab_size=53, max_seq_len=64, d_model=48, num_layers=2, num_heads=6).eval()
engine = Engine(model, cache_tokens=256)
print(engine.paged_attention_note)
try:
    Engine(model, cache_tokens=256, paged_attention="in-place")
except GenerationError as error:
    print(error)
config = GenerationConfig(max_new_tokens=8, eos_token_id=())
[request] = engine.complete([[1, 2, 3]], config)
alone = tformer.generate(model, torch.tensor([[1, 2, 3]]), generation_config=config)[0, 3:].tolist()
print(request.outputs()[0] == alone)
print(load_or_none() is None)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TFORMER_COMPILED_KERNELS": "0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "paged attention: gather (the compiled kernels are off (TFORMER_COMPILED_KERNELS=0))",
        "paged_attention='in-place' cannot serve this model: the compiled kernels are off (TFORMER_COMPILED_KERNELS=0)",
        "True", "True"]
