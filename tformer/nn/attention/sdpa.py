"""The ``sdpa`` kernel (the default): PyTorch's fused ``scaled_dot_product_attention`` under the
pass's dense mask, or plain causality with no mask at all when nothing else is masked.

A decoding step of many sequences on the CPU (one query each: beam search, batched generation) runs the
compiled ``dense_decode`` (``nn/kernels/dense_decode.cpp``) instead: PyTorch's kernel tiles blocks of
queries, and with one query a block its tiling costs more than the arithmetic (1.4-2x faster on beam-5
shapes, ``docs/generation.md``). Same function, other summation order: results differ by float rounding
(about 1e-6 here)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tformer.nn import compiled
from tformer.nn.attention.flex import flex_attend, routes_to_flex
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
    reference path when asked for). It never forms the scores, so it cannot soft-cap them."""

    name = "sdpa"
    segments = True
    dropout = True
    reads_pages = True
    gpu_flex = True

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, *, dropout_p: float = 0.0,
                 need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if need_weights:
            return reference_with_mask(q, k, v, mask, dropout_p, scale=self.scale)
        if dropout_p == 0.0 and routes_to_flex(self, q, mask):  # a bias or packed examples on a GPU: one fused kernel
            return flex_attend(q, k, v, mask, scale=self.scale), None
        q_len, k_len = q.shape[2], k.shape[2]
        found = mask._derived.get((q_len, k_len, q.dtype))  # the dense form, once built, read directly
        dense, is_causal = mask.dense(q_len, k_len, q.dtype, q.device) if found is None else found
        if q_len == 1 and dropout_p == 0.0 and _many_sequences_decoding(q, k, v):
            kernels = compiled.load_or_none()
            if kernels is not None:  # a query that sees no key gets zeros there too
                mask_or_none = compiled.NONE if dense is None else dense
                return kernels.dense_decode(q, k, v, mask_or_none, self.scale or q.shape[-1] ** -0.5), None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, dropout_p=dropout_p, is_causal=is_causal,
                                             scale=self.scale, enable_gqa=k.shape[1] != q.shape[1])
        if mask.key_padding is None or mask.real_queries:  # no row can be empty
            return out, None
        return zero_empty_rows(out, None, mask, k_len)


# Below this many (sequence, key/value head) pairs a thread, PyTorch's kernel, which also splits the keys among
# threads, is as fast or faster (batch-1 decoding: 0.135 against 0.151 ms over 1,000 keys, 12 heads, 2 threads).
PAIRS_PER_THREAD = 16


def _many_sequences_decoding(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether one query per sequence is better served by ``dense_decode``: float32 on the CPU, no gradient,
    keys and values with unit head-size stride (a cache's filled part), enough sequences to share out; not in a
    step being compiled (the compiled kernel is opaque to the tracer)."""
    if q.device.type != "cpu" or q.dtype != torch.float32 or k.stride(-1) != 1 or v.stride(-1) != 1:
        return False
    if torch.compiler.is_compiling():
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    return q.shape[0] * k.shape[1] >= PAIRS_PER_THREAD * torch.get_num_threads()
