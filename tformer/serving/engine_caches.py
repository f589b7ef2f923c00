"""The engine's caches, made from what each layer declares (``nn.attention.cache_spec``): one block pool for the
layers whose keys are kept per token, a row per running sequence for a running state or an encoder's keys, checked
against the device's memory before anything is allocated; and whether those caches let prompts share a prefix."""

from __future__ import annotations

import torch

from tformer.generation.settings import GenerationError
from tformer.memory import available_memory, format_bytes
from tformer.nn.attention.cache_spec import CacheSpec, CrossAttention, LayerCacheSpec, RunningSums
from tformer.nn.attention.paged import PagedCache, PagedCrossCache
from tformer.nn.attention.performer import RunningSumSlots
from tformer.nn.block import LayerCache
from tformer.serving.block_pool import BlockPool, blocks_for


def each_spec(specs: list[LayerCacheSpec]) -> list[CacheSpec]:
    """Every cache the layers declare: each block's self-attention's, then its cross-attention's."""
    return [spec for layer in specs for spec in (layer.self_attention, layer.cross_attention) if spec is not None]


def shares_prefixes(asked: bool | None, specs: list[LayerCacheSpec]) -> bool:
    """Whether prompts share cached prefixes: as ``asked``, None where every layer's cache is per token; a
    running state (its sums cover the whole prefix, no block of it stands alone) or an encoder's keys (the
    decoder's prefix means nothing without its source) refuse True."""
    states = [spec for spec in each_spec(specs) if not spec.paged]
    if asked and states:
        raise GenerationError(f"prefix_caching=True cannot be honoured: a layer keeps {type(states[0]).__name__} per "
                              "sequence, not keys per token, so no prefix of it can be shared (False or None)")
    return not states if asked is None else asked


def allocate(layers: list[LayerCacheSpec], cache_tokens: int, block_size: int, max_running: int,
              dtype: torch.dtype, device: torch.device) -> tuple[BlockPool, list[LayerCache]]:
    """The engine's caches from each layer's spec: a block pool holding the per-token layers (full attention, a
    sliding window), a row per running sequence of each running-state layer and of each cross-attention (the
    encoder's keys, as long as its source); checked against memory first (the sources' keys aside)."""
    specs = [layer.self_attention for layer in layers]
    paged = [spec for spec in specs if spec.paged]
    unknown = [spec for spec in specs if not spec.paged and not isinstance(spec, RunningSums)]
    unknown += [layer.cross_attention for layer in layers
                if layer.cross_attention is not None and not isinstance(layer.cross_attention, CrossAttention)]
    if unknown:
        raise GenerationError(f"the server cannot keep a layer's {type(unknown[0]).__name__} cache")
    shapes = sorted({(spec.num_kv_heads, spec.head_dim) for spec in paged})
    if len(shapes) > 1:
        raise GenerationError(f"the layers' key/value heads and head sizes differ ({shapes}): one block pool holds "
                              "one shape")
    heads, head_dim = shapes[0] if shapes else (1, 1)
    num_blocks = blocks_for(cache_tokens, block_size)
    _check_pool_fits(cache_tokens, num_blocks * block_size, sum(spec.bytes_per_token(dtype) for spec in specs),
                     max_running * sum(spec.bytes_per_sequence(dtype) for spec in specs), device)
    pool = BlockPool(num_blocks, block_size, len(paged), heads, head_dim, dtype, device)
    caches, layer = [], 0
    for spec, declared in zip(specs, layers, strict=True):
        if spec.paged:
            own = PagedCache(pool.keys[layer], pool.values[layer])
            layer += 1
        else:
            own = RunningSumSlots(spec, max_running, dtype, device)
        caches.append(LayerCache(own, None if declared.cross_attention is None else PagedCrossCache(max_running)))
    return pool, caches


def _check_pool_fits(cache_tokens: int, slots: int, per_token: int, states: int, device: torch.device) -> None:
    """A GenerationError naming the memory ``cache_tokens`` would take (``slots`` tokens of ``per_token`` bytes, and
    ``states`` bytes of running states) and the most tokens that fit, before it is allocated (an allocation that
    large fails with a traceback, or the kernel ends the process)."""
    available = available_memory(device)
    if available is not None and slots * per_token + states > available:
        room = max(0, available - states) // max(per_token, 1)
        raise GenerationError(f"cache_tokens={cache_tokens} needs {format_bytes(slots * per_token + states)} of cache "
                              f"({per_token} bytes a token, {format_bytes(states)} of running states); "
                              f"{format_bytes(available)} is available on {device.type}: cache_tokens must be in "
                              f"[1, {room}]")


