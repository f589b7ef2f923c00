"""The ``sdpa`` kernel (the default): PyTorch's fused ``scaled_dot_product_attention`` under the
pass's dense mask, or plain causality with no mask at all when nothing else is masked."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from tformer.nn.attention.kernel import AttentionKernel
from tformer.nn.attention.mask import AttentionMask, additive_mask, causal_mask, zero_empty_rows
from tformer.nn.attention.reference import attention_reference, reference_with_mask


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


class SdpaKernel(AttentionKernel):
    """Exact softmax attention through PyTorch's fused kernel; attention dropout; weights (computed on the
    reference path when asked for)."""

    name = "sdpa"
    dropout = True
    reads_pages = True

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, *, dropout_p: float = 0.0,
                 need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if need_weights:
            return reference_with_mask(q, k, v, mask, dropout_p)
        q_len, k_len = q.shape[2], k.shape[2]
        found = mask._derived.get((q_len, k_len, q.dtype))  # the dense form, once built, read directly
        dense, is_causal = mask.dense(q_len, k_len, q.dtype, q.device) if found is None else found
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, dropout_p=dropout_p, is_causal=is_causal,
                                             enable_gqa=k.shape[1] != q.shape[1])
        if mask.key_padding is None or mask.real_queries:  # no row can be empty
            return out, None
        return zero_empty_rows(out, None, mask, k_len)
