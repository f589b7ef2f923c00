"""The ``reference`` kernel: attention written out (scores, optional soft cap, additive mask, softmax, weighted
sum), the plain definition every other kernel is checked against."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tformer.nn.attention.kernel import AttentionKernel
from tformer.nn.attention.mask import AttentionMask, additive_mask, causal_mask, zero_empty_rows


def attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    softcap: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Plain attention: scores, soft cap, additive mask, softmax, weighted sum.

    q: (B, H, Tq, Dh); k, v: (B, Hkv, Tk, Dh) with Hkv dividing H. Returns the output
    (B, H, Tq, Dh) and the attention weights (B, H, Tq, Tk). ``softcap`` (c): the scaled scores become
    c * tanh(scores / c) before the mask is added (Gemma 2).
    """
    k, v = expand_kv(q, k), expand_kv(q, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
    scores = soft_cap(scores, softcap)
    if is_causal:
        scores = scores + additive_mask(causal_mask(q.shape[-2], k.shape[-2], q.device), scores.dtype)
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, v), weights


def soft_cap(values: Tensor, cap: float | None) -> Tensor:
    """``cap * tanh(values / cap)``: values squashed smoothly into (-cap, cap) (Gemma 2's attention scores and
    logits); ``values`` themselves when ``cap`` is None."""
    return values if cap is None else torch.tanh(values / cap) * cap


def expand_kv(q: Tensor, kv: Tensor) -> Tensor:
    """Repeat each key/value head for the query heads that share it: (B, Hkv, T, Dh) -> (B, H, T, Dh)."""
    groups = q.shape[1] // kv.shape[1]
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)


def reference_with_mask(q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, dropout_p: float = 0.0,
                        extra: Tensor | None = None, scale: float | None = None,
                        softcap: float | None = None) -> tuple[Tensor, Tensor]:
    """``attention_reference`` under an ``AttentionMask`` (plus an ``extra`` additive mask, a band), with the
    rows of queries that see no key set to zero: the weights any exact kernel returns when asked for."""
    dense, is_causal = mask.dense(q.shape[2], k.shape[2], q.dtype, q.device)
    if extra is not None:
        if is_causal:
            dense, is_causal = additive_mask(causal_mask(q.shape[2], k.shape[2], q.device), q.dtype), False
        dense = extra if dense is None else dense + extra
    out, weights = attention_reference(q, k, v, dense, is_causal, dropout_p, scale, softcap)
    return zero_empty_rows(out, weights, mask, k.shape[2])


class ReferenceKernel(AttentionKernel):
    """Exact softmax attention, written out: O(T^2) time and memory; attention dropout; its weights."""

    name = "reference"
    segments = True
    dropout = True
    softcap = True
    reads_pages = True

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, *, dropout_p: float = 0.0,
                 need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        out, weights = reference_with_mask(q, k, v, mask, dropout_p, scale=self.scale, softcap=self.cap)
        return out, weights if need_weights else None
