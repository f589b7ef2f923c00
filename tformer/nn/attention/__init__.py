"""Attention, written once: the multi-head layer, its kernels (one file each, by name in
``registry.py``), the one mask convention (``mask.py``) and the cache backends a decoding step attends
through (``cache.py``, ``paged.py``, Performer's state)."""

from tformer.nn.attention.cache import CrossAttentionCache, KVCache, RollingKVCache
from tformer.nn.attention.chunked import chunked_attention
from tformer.nn.attention.kernel import AttentionKernel
from tformer.nn.attention.mask import (
    AttentionMask,
    BlockBias,
    PositionBias,
    StepLayout,
    additive_mask,
    band_mask,
    causal_mask,
    padding_mask,
)
from tformer.nn.attention.module import MultiHeadAttention, Rotary
from tformer.nn.attention.reference import attention_reference
from tformer.nn.attention.registry import KERNELS, kernel_class
from tformer.nn.attention.sdpa import attention

__all__ = [
    "KERNELS", "AttentionKernel", "AttentionMask", "BlockBias", "CrossAttentionCache", "KVCache",
    "MultiHeadAttention", "PositionBias", "RollingKVCache", "Rotary", "StepLayout", "additive_mask", "attention",
    "attention_reference", "band_mask", "causal_mask", "chunked_attention", "kernel_class", "padding_mask",
]
