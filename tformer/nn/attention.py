"""Scaled dot-product attention, written once: a readable reference, a fast dispatch, masks,
a key/value cache and the multi-head module (self / cross, MHA / GQA / MQA).

Mask convention: ``mask`` is an *additive* float tensor broadcastable to ``(B, H, Tq, Tk)``
holding 0 where a query may attend and a large negative number where it may not, plus any
additive position bias (ALiBi, relative buckets). Boolean masks (True = attend) are turned
into that form once, by ``additive_mask``, so both paths see exactly the same numbers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.nn.position import apply_rotary


def attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Plain attention: scores, additive mask, softmax, weighted sum.

    q: (B, H, Tq, Dh); k, v: (B, Hkv, Tk, Dh) with Hkv dividing H. Returns the output
    (B, H, Tq, Dh) and the attention weights (B, H, Tq, Tk).
    """
    k, v = _expand_kv(q, k), _expand_kv(q, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
    if is_causal:
        scores = scores + additive_mask(causal_mask(q.shape[-2], k.shape[-2], q.device), scores.dtype)
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, v), weights


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attention through PyTorch's fused kernel, or the reference path when weights are wanted.

    Same shapes and mask convention as ``attention_reference``. ``is_causal`` requires
    Tq == Tk; for a query block that continues a cache, pass an explicit mask instead.
    """
    if is_causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"is_causal needs equal query and key lengths, got {q.shape[-2]} and {k.shape[-2]}; "
            "pass an explicit mask (see causal_mask) for cached decoding"
        )
    if need_weights:
        return attention_reference(q, k, v, mask, is_causal, dropout_p, scale)
    if is_causal and mask is not None:
        mask = mask + additive_mask(causal_mask(q.shape[-2], k.shape[-2], q.device), mask.dtype)
        is_causal = False
    out = F.scaled_dot_product_attention(
        q, k, v,
        attn_mask=None if mask is None else mask.to(q.dtype),
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=k.shape[1] != q.shape[1],
    )
    return out, None


def _expand_kv(q: Tensor, kv: Tensor) -> Tensor:
    """Repeat each key/value head for the query heads that share it: (B, Hkv, T, Dh) -> (B, H, T, Dh)."""
    groups = q.shape[1] // kv.shape[1]
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)


# ---- masks ----------------------------------------------------------------------------------


def causal_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean (Tq, Tk) mask, True = attend: query i (the last Tq of Tk positions) sees keys <= its own."""
    offset = k_len - q_len
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + offset
    k_pos = torch.arange(k_len, device=device).unsqueeze(0)
    return k_pos <= q_pos


def padding_mask(attention_mask: Tensor) -> Tensor:
    """Boolean (B, 1, 1, Tk) mask from an ``attention_mask`` (B, Tk) with 1 = attend."""
    return attention_mask.bool()[:, None, None, :]


def additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where ``allowed`` is True, the most negative finite value of ``dtype`` elsewhere.

    A finite value keeps fully masked rows (padding queries) free of NaN.
    """
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def build_mask(
    q_len: int,
    k_len: int,
    *,
    causal: bool,
    attention_mask: Tensor | None = None,
    position_bias: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[Tensor | None, bool]:
    """The one additive mask for a forward pass, and whether the kernel may use ``is_causal``.

    Boolean parts (causality, padding) are combined first and made additive once, then any
    position bias (B|1, H, Tq, Tk) is added. With no padding and no bias a causal pass
    returns ``(None, True)`` so the fused kernel can skip the mask entirely.
    """
    if attention_mask is None and position_bias is None:
        if not causal:
            return None, False
        if q_len == k_len:
            return None, True
    allowed: Tensor | None = None
    if causal:
        allowed = causal_mask(q_len, k_len, device)[None, None]  # (1, 1, Tq, Tk)
    if attention_mask is not None:
        pad = padding_mask(attention_mask)
        allowed = pad if allowed is None else allowed & pad
    mask = None if allowed is None else additive_mask(allowed, dtype)
    if position_bias is not None:
        mask = position_bias.to(dtype) if mask is None else mask + position_bias.to(dtype)
    return mask, False


# ---- key/value cache ------------------------------------------------------------------------


class KVCache:
    """Preallocated keys and values of one attention layer, filled as decoding proceeds.

    Holds only the key/value heads, so grouped- and multi-query models cache less.
    """

    def __init__(
        self,
        batch_size: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (batch_size, num_kv_heads, max_len, head_dim)  # (B, Hkv, Tmax, Dh)
        self.keys = torch.empty(shape, dtype=dtype, device=device)
        self.values = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.keys.shape[2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values (B, Hkv, T, Dh); return all cached so far (views, no copy)."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {end} positions exceed its length {self.max_len}")
        self.keys[:, :, self.length:end] = k
        self.values[:, :, self.length:end] = v
        self.length = end
        return self.cached()

    def cached(self) -> tuple[Tensor, Tensor]:
        """Everything cached so far (views): (B, Hkv, length, Dh) each."""
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def reorder(self, batch_indices: Tensor) -> None:
        """Keep the rows named by ``batch_indices`` (beam search), in that order."""
        self.keys = self.keys.index_select(0, batch_indices)
        self.values = self.values.index_select(0, batch_indices)

    def grow(self, max_len: int) -> None:
        """Make room for ``max_len`` positions, keeping what is cached (the filled part is copied)."""
        if max_len <= self.max_len:
            return
        batch, kv_heads, _, head_dim = self.keys.shape
        keys = self.keys.new_empty(batch, kv_heads, max_len, head_dim)
        values = self.values.new_empty(batch, kv_heads, max_len, head_dim)
        keys[:, :, : self.length] = self.keys[:, :, : self.length]
        values[:, :, : self.length] = self.values[:, :, : self.length]
        self.keys, self.values = keys, values

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


# ---- multi-head attention -------------------------------------------------------------------


Rotary = tuple[Tensor, Tensor]  # cos, sin: (B, 1, T, Dh)


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with ``num_heads`` query heads sharing ``num_kv_heads`` key/value heads.

    Self-attention projects queries, keys and values with one fused matrix
    ``qkv_proj`` (rows: H*Dh queries, then Hkv*Dh keys, then Hkv*Dh values); cross-attention
    projects queries from the input (``q_proj``) and keys/values from the context (``kv_proj``).
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
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.head_dim = d_model // num_heads if head_dim is None else head_dim
        self.dropout = dropout
        self.cross = cross
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        if cross:
            self.q_proj = nn.Linear(d_model, q_size, bias=bias)
            self.kv_proj = nn.Linear(d_model, 2 * kv_size, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, q_size + 2 * kv_size, bias=bias)
        self.out_proj = nn.Linear(q_size, d_model, bias=bias)

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        rotary: Rotary | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D); context (cross-attention): (B, S, D). Returns (B, T, D) and weights or None."""
        q, k, v = self._project(x, context, cache)
        if rotary is not None:
            cos, sin = rotary
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.cached() if k is None else cache.append(k, v)
        out, weights = attention(
            q, k, v, mask=mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights,
        )
        batch, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        return self.out_proj(out), weights

    def _project(
        self, x: Tensor, context: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Queries (B, H, T, Dh) and new keys/values (B, Hkv, S, Dh), or None if already cached."""
        batch, length, _ = x.shape
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        if not self.cross:
            q, k, v = self.qkv_proj(x).split([q_size, kv_size, kv_size], dim=-1)
        else:
            if context is None:
                raise ValueError("cross-attention needs a context (the encoder output)")
            q = self.q_proj(x)
            if cache is not None and cache.length > 0:
                k = v = None
            else:
                k, v = self.kv_proj(context).split([kv_size, kv_size], dim=-1)
        q = q.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        if k is not None:
            source_len = k.shape[1]
            k = k.view(batch, source_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(batch, source_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v
