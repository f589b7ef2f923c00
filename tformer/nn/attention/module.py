"""MultiHeadAttention: the one attention layer (self or cross, MHA / GQA / MQA). It projects queries,
keys and values, rotates them (RoPE), and hands them to its kernel, through a cache backend when
decoding; then it merges the heads and projects back."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from tformer.nn.attention.cache_spec import CacheSpec
from tformer.nn.attention.mask import NO_MASK, AttentionMask
from tformer.nn.attention.registry import KERNELS, kernel_class
from tformer.nn.positions import apply_rotary

Rotary = tuple[Tensor, Tensor]  # cos, sin: (B, 1, T, Dh)


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with ``num_heads`` query heads sharing ``num_kv_heads`` key/value heads.

    Self-attention projects queries, keys and values with one fused matrix ``qkv_proj`` (rows: H*Dh
    queries, then Hkv*Dh keys, then Hkv*Dh values); cross-attention projects queries from the input
    (``q_proj``) and keys/values from the context (``kv_proj``). ``kernel`` names how attention is
    computed (``nn.attention.registry.KERNELS``), with ``kernel_settings`` the config fields it reads
    (the sliding window's ``attention_window``, Performer's ``performer_features``, ...); a kernel
    without attention dropout refuses ``dropout`` > 0. ``scale`` multiplies the scores (None: head_dim**-0.5)
    and ``softcap`` caps them (``cap * tanh(scores / cap)``, Gemma 2); a kernel that cannot refuses them.

    ``key_bias=False`` (with ``bias``): the keys get no bias, the queries, values and output keep theirs
    (Whisper). The projection that makes keys (``qkv_proj``, cross-attention's ``kv_proj``) then has no bias of
    its own; ``keyless_bias`` (a ``KeylessBias``) holds the biases of its other rows and adds them after it, so
    a weight backend swapped in for the projection (prepacked, int8, ...) changes nothing. ``output_bias=False``
    (with ``bias``): the output projection has none (Qwen2).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        cross: bool = False,
        kernel: str = "sdpa",
        kernel_settings: dict[str, Any] | None = None,
        key_bias: bool = True,
        output_bias: bool = True,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        kernel_type = kernel_class(kernel)
        if dropout and not kernel_type.dropout:
            with_dropout = ", ".join(name for name, k in KERNELS.items() if k.dropout)
            raise ValueError(f"kernel={kernel!r} has no attention dropout (dropout={dropout}); use {with_dropout}")
        self.num_heads = num_heads
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.head_dim = d_model // num_heads if head_dim is None else head_dim
        self.dropout = dropout
        self.cross = cross
        self.kernel = kernel_type(self.head_dim, cross, scale=scale, softcap=softcap, **(kernel_settings or {}))
        for name, module in self.kernel.modules().items():
            self.add_module(name, module)
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        fused_bias = bias and key_bias  # a bias on every row of the projection that makes keys
        if cross:
            self.q_proj = nn.Linear(d_model, q_size, bias=bias)
            self.kv_proj = nn.Linear(d_model, 2 * kv_size, bias=fused_bias)
        else:
            self.qkv_proj = nn.Linear(d_model, q_size + 2 * kv_size, bias=fused_bias)
        self.out_proj = nn.Linear(q_size, d_model, bias=bias and output_bias)
        self.add_module("keyless_bias", KeylessBias(0 if cross else q_size, kv_size, kv_size)
                        if bias and not key_bias else None)

    def new_cache(self, batch_size: int, max_len: int, dtype, device) -> Any:
        """This layer's self-attention cache for decoding up to ``max_len`` positions (its kernel's backend)."""
        return self.kernel.new_cache(batch_size, self.num_kv_heads, max_len, self.head_dim, dtype, device)

    def cache_spec(self) -> CacheSpec:
        """What this layer keeps between decoding steps (its kernel's declaration)."""
        return self.kernel.cache_spec(self.num_kv_heads, self.head_dim)

    def forward(
        self,
        x: Tensor,
        *,
        mask: AttentionMask | None = None,
        context: Tensor | None = None,
        rotary: Rotary | None = None,
        cache: Any = None,
        need_weights: bool = False,
        shape: tuple[int, int] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D), or the same rows flattened (B * T, D) with ``shape`` = (B, T); context
        (cross-attention): (B, S, D). Returns the output in x's layout and the weights (B, H, T, keys) when
        asked for, else None. ``mask``: the pass's ``AttentionMask`` (None: every query sees every key);
        ``cache``: a cache backend (``nn.attention.cache``) when decoding."""
        batch, length = x.shape[:2] if shape is None else shape
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        projections = self._modules  # read directly: a decoding step runs every layer once per token
        if not self.cross:
            qkv = projections["qkv_proj"](x)
            keyless_bias = projections["keyless_bias"]
            if keyless_bias is not None:
                qkv = keyless_bias(qkv)
            q, k, v = qkv.split_with_sizes([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
            k = k.view(batch, length, kv_heads, head_dim).transpose(1, 2)  # (B, Hkv, T, Dh)
            v = v.view(batch, length, kv_heads, head_dim).transpose(1, 2)
        else:
            if context is None:
                raise ValueError("cross-attention needs a context (the encoder output)")
            q = projections["q_proj"](x)
            k = v = None  # already cached
            if cache is None or not cache.filled:
                sources, source_len = context.shape[:2]  # a step's beams may share their source's row
                kv = projections["kv_proj"](context)
                keyless_bias = projections["keyless_bias"]
                if keyless_bias is not None:
                    kv = keyless_bias(kv)
                k, v = kv.split_with_sizes([kv_heads * head_dim, kv_heads * head_dim], dim=-1)
                k = k.view(sources, source_len, kv_heads, head_dim).transpose(1, 2)  # (B, Hkv, S, Dh)
                v = v.view(sources, source_len, kv_heads, head_dim).transpose(1, 2)
        q = q.view(batch, length, heads, head_dim).transpose(1, 2)  # (B, H, T, Dh)
        if rotary is not None:
            cos, sin = rotary
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if mask is None:
            mask = NO_MASK
        if cache is None:
            dropout = self.dropout if self.training else 0.0
            out, weights = self.kernel(q, k, v, mask, dropout_p=dropout, need_weights=need_weights)
        else:
            out, weights = cache.attend(self.kernel, q, k, v, mask, need_weights)
        out = out.transpose(1, 2).reshape(*x.shape[:-1], heads * head_dim)  # back to x's layout
        return projections["out_proj"](out), weights


class KeylessBias(nn.Module):
    """The bias of a fused projection whose key rows have none (``key_bias=False``): ``bias`` holds the rows
    before the keys (queries; none in cross-attention's key-value projection), then the rows after (values),
    zero at first as nn.Linear's biases are after ``init_weights``."""

    def __init__(self, before: int, keys: int, after: int) -> None:
        super().__init__()
        self.before, self.keys = before, keys
        self.bias = nn.Parameter(torch.zeros(before + after))

    def forward(self, projected: Tensor) -> Tensor:
        """The projection's output (..., before + keys + after) plus the bias, zero on the key rows."""
        bias = self.bias
        return projected + torch.cat([bias[: self.before], bias.new_zeros(self.keys), bias[self.before:]])
