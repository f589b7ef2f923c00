"""Scaled dot-product attention, written once: a readable reference, a fast dispatch, an exact
chunked kernel with memory linear in length, masks, key/value caches and the multi-head module
(self / cross, MHA / GQA / MQA) with its choice of kernel.

Mask convention: ``mask`` is an *additive* float tensor broadcastable to ``(B, H, Tq, Tk)``
holding 0 where a query may attend and a large negative number where it may not, plus any
additive position bias (ALiBi, relative buckets). Boolean masks (True = attend) are turned
into that form once, by ``additive_mask``, so both paths see exactly the same numbers.
Kernels that never form the (Tq, Tk) matrix (chunked, sliding window, Performer) take the
mask as its parts instead (``MaskParts``: causal or not, key padding, a bias built block by block).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import ATTENTION_KERNELS
from tformer.nn.performer import PerformerProjection, performer_attention
from tformer.nn.position import apply_rotary

# bias(query_index (tq,), key_index (tk,)) -> additive bias (1|B, H, tq, tk) of those rows and columns.
BlockBias = Callable[[Tensor, Tensor], Tensor]


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


# ---- chunked exact attention ----------------------------------------------------------------


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    bias: Tensor | BlockBias | None = None,
    scale: float | None = None,
    query_block: int = 128,
    key_block: int = 128,
    window: int | None = None,
) -> Tensor:
    """Exact softmax attention over blocks of queries and keys with a running (online) softmax:
    no (Tq, Tk) matrix is formed, so memory grows linearly in length (FlashAttention's recipe).

    q: (B, H, Tq, Dh); k, v: (B, Hkv, Tk, Dh) with Hkv dividing H. Returns (B, H, Tq, Dh).
    ``causal``: the queries are the last Tq of the Tk positions (a block continuing a cache) and
    see keys up to their own; key blocks wholly in the future are skipped. ``window`` (W): each
    query sees only the keys within W of it (causal: i - W .. i; otherwise |i - j| <= W), and key
    blocks outside the band are skipped. ``key_padding_mask`` (B, Tk) bool, True = attend.
    ``bias``: an additive tensor broadcastable to (B, H, Tq, Tk), or a callable ``bias(query_index,
    key_index)`` of a block's query rows (tq,) and key columns (tk,) returning (1|B, H, tq, tk): ALiBi
    and relative biases built block by block; gradients reach the parameters it reads. A query that
    may see no key gets 0. The backward pass recomputes each block's scores from the saved output
    and per-query log-sum-exp. No dropout (the model refuses attention_dropout with this kernel).
    """
    batch, heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"key/value heads ({kv_heads}) must divide query heads ({heads})")
    for name, size in (("query_block", query_block), ("key_block", key_block)):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"{name}={size!r} must be a positive integer")
    if window is not None and (not isinstance(window, int) or window < 0):
        raise ValueError(f"window={window!r} must be None or an integer >= 0")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (batch, k_len):
        raise ValueError(f"key_padding_mask has shape {tuple(key_padding_mask.shape)}, expected ({batch}, {k_len})")
    spec = _ChunkSpec(causal, 1.0 / math.sqrt(head_dim) if scale is None else scale, query_block, key_block,
                      window, bias if callable(bias) else None)
    bias_tensor = None
    if isinstance(bias, Tensor):
        bias_tensor = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))  # (B|1, H|1, Tq|1, Tk|1)
    leaves = _bias_leaves(spec.bias, q.device) if spec.bias is not None and torch.is_grad_enabled() else ()
    return _ChunkedAttention.apply(q, k, v, key_padding_mask, bias_tensor, spec, *leaves)


@dataclass(frozen=True)
class _ChunkSpec:
    causal: bool
    scale: float
    query_block: int
    key_block: int
    window: int | None
    bias: BlockBias | None


class _ChunkedAttention(torch.autograd.Function):
    """Forward: online softmax per query block; saves q, k, v, the output and the log-sum-exp of each
    query row. Backward: recomputes each block's probabilities from the log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, key_padding_mask, bias, spec, *leaves):
        out = q.new_empty(q.shape)  # (B, H, Tq, Dh)
        out5, q5, k5, v5 = _grouped(out, k), _grouped(q, k), k.unsqueeze(2), v.unsqueeze(2)
        compute = _compute_dtype(q.dtype)
        lse = torch.empty(out5.shape[:-1], dtype=compute, device=q.device)  # (B, Hkv, G, Tq)
        for qs, qe, key_blocks in _block_plan(spec, q.shape[2], k.shape[2]):
            rows = (*q5.shape[:3], qe - qs, 1)
            running_max = torch.full(rows, -math.inf, dtype=compute, device=q.device)
            total = torch.zeros(rows, dtype=compute, device=q.device)
            acc = torch.zeros((*rows[:-1], q.shape[-1]), dtype=compute, device=q.device)
            for ks, ke in key_blocks:
                scores = _block_scores(q5, k5, qs, qe, ks, ke, key_padding_mask, bias, spec)[0]
                new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
                shift = new_max.masked_fill(new_max == -math.inf, 0.0)  # rows that have seen no key yet
                probabilities = torch.exp(scores - shift)
                correction = torch.exp(running_max - shift)
                total = total * correction + probabilities.sum(-1, keepdim=True)
                acc = acc * correction + torch.matmul(probabilities.to(v.dtype), v5[..., ks:ke, :]).to(compute)
                running_max = new_max
            seen = total > 0
            out5[..., qs:qe, :] = torch.where(seen, acc / total.clamp(min=torch.finfo(compute).tiny), 0.0).to(q.dtype)
            shift = running_max.masked_fill(~seen, 0.0)
            lse[..., qs:qe] = torch.where(seen, shift + torch.log(total), math.inf).squeeze(-1)
        ctx.save_for_backward(q, k, v, out, lse, key_padding_mask, bias, *leaves)
        ctx.spec = spec
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, key_padding_mask, bias, *leaves = ctx.saved_tensors
        spec: _ChunkSpec = ctx.spec
        compute = lse.dtype
        q5, k5, v5 = _grouped(q, k), k.unsqueeze(2), v.unsqueeze(2)
        grad5 = _grouped(grad_out, k).to(compute)  # (B, Hkv, G, Tq, Dh)
        delta = (grad5 * _grouped(out, k).to(compute)).sum(-1, keepdim=True)  # (B, Hkv, G, Tq, 1)
        grad_q = torch.zeros(q5.shape, dtype=compute, device=q.device)
        grad_k = torch.zeros(k.shape, dtype=compute, device=k.device)  # (B, Hkv, Tk, Dh)
        grad_v = torch.zeros(v.shape, dtype=compute, device=v.device)
        grad_bias = torch.zeros(bias.shape, dtype=compute, device=bias.device) if ctx.needs_input_grad[4] else None
        grad_leaves: list[Tensor | None] = [None] * len(leaves)
        for qs, qe, key_blocks in _block_plan(spec, q.shape[2], k.shape[2]):
            q_rows, grad_rows = q5[..., qs:qe, :], grad5[..., qs:qe, :]
            for ks, ke in key_blocks:
                scores, bias_block = _block_scores(q5, k5, qs, qe, ks, ke, key_padding_mask, bias, spec,
                                                   keep_graph=bool(leaves))
                probabilities = torch.exp(scores - lse[..., qs:qe, None])  # (B, Hkv, G, tq, tk)
                grad_v[:, :, ks:ke] += torch.matmul(probabilities.transpose(-2, -1), grad_rows).sum(2)
                grad_p = torch.matmul(grad_rows, v5[..., ks:ke, :].transpose(-2, -1).to(compute))
                grad_scores = probabilities * (grad_p - delta[..., qs:qe, :])  # (B, Hkv, G, tq, tk)
                grad_q[..., qs:qe, :] += torch.matmul(grad_scores, k5[..., ks:ke, :].to(compute)) * spec.scale
                grad_k[:, :, ks:ke] += (torch.matmul(grad_scores.transpose(-2, -1), q_rows.to(compute)).sum(2)
                                        * spec.scale)
                grad_heads = grad_scores.flatten(1, 2)  # (B, H, tq, tk)
                if grad_bias is not None:
                    rows = slice(qs, qe) if bias.shape[2] > 1 else slice(None)
                    columns = slice(ks, ke) if bias.shape[3] > 1 else slice(None)
                    target = grad_bias[:, :, rows, columns]
                    target += grad_heads.sum_to_size(target.shape)
                if leaves and bias_block is not None and bias_block.requires_grad:
                    found = torch.autograd.grad(bias_block, leaves, grad_heads.sum_to_size(bias_block.shape).to(
                        bias_block.dtype), allow_unused=True)
                    grad_leaves = [g if total is None else total if g is None else total + g
                                   for total, g in zip(grad_leaves, found, strict=True)]
        return (grad_q.flatten(1, 2).to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None,
                None if grad_bias is None else grad_bias.to(bias.dtype), None, *grad_leaves)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax statistics and accumulators: float32 for half types, else the inputs' own."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _grouped(x: Tensor, kv: Tensor) -> Tensor:
    """(B, H, T, Dh) -> (B, Hkv, G, T, Dh): query head h reads key/value head h // G (a view)."""
    return x.unflatten(1, (kv.shape[1], x.shape[1] // kv.shape[1]))


def _block_plan(spec: _ChunkSpec, q_len: int, k_len: int):
    """For each query block [qs, qe): the key blocks [ks, ke) it may see (causality and the window)."""
    offset = k_len - q_len  # queries are the last q_len of the k_len positions
    window = spec.window
    for qs in range(0, q_len, spec.query_block):
        qe = min(qs + spec.query_block, q_len)
        low = 0 if window is None else max(0, qs + offset - window)
        if spec.causal:
            high = min(k_len, qe + offset)
        else:
            high = k_len if window is None else min(k_len, qe + offset + window)
        yield qs, qe, [(ks, min(ks + spec.key_block, high)) for ks in range(low, high, spec.key_block)]


def _block_scores(q5, k5, qs, qe, ks, ke, key_padding_mask, bias, spec, keep_graph=False):
    """Scaled scores of one block (B, Hkv, G, tq, tk) plus bias, -inf where a query may not look; and
    the callable bias's block (1|B, H, tq, tk) with its graph when ``keep_graph`` (else None)."""
    compute = _compute_dtype(q5.dtype)
    scores = torch.matmul(q5[..., qs:qe, :], k5[..., ks:ke, :].transpose(-2, -1)).to(compute) * spec.scale
    kv_heads, groups = q5.shape[1], q5.shape[2]
    bias_block = None
    if bias is not None:
        rows = slice(qs, qe) if bias.shape[2] > 1 else slice(None)
        columns = slice(ks, ke) if bias.shape[3] > 1 else slice(None)
        block = bias[:, :, rows, columns]
        heads = (kv_heads, groups) if block.shape[1] > 1 else (1, 1)
        scores = scores + block.unflatten(1, heads).to(compute)
    if spec.bias is not None:
        device = scores.device
        with torch.set_grad_enabled(keep_graph):
            bias_block = spec.bias(torch.arange(qs, qe, device=device), torch.arange(ks, ke, device=device))
        scores = scores + bias_block.detach().unflatten(1, (kv_heads, groups)).to(compute)
    offset = k5.shape[3] - q5.shape[3]
    allowed = _block_allowed(qs, qe, ks, ke, offset, spec.causal, spec.window, scores.device)
    if key_padding_mask is not None:
        padding = key_padding_mask[:, None, None, None, ks:ke]  # (B, 1, 1, 1, tk)
        allowed = padding if allowed is None else allowed & padding
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    return scores, bias_block if keep_graph else None


def _block_allowed(qs, qe, ks, ke, offset, causal, window, device) -> Tensor | None:
    """Boolean (tq, tk), True = attend, of one block by position; None when every pair is allowed."""
    first, last = qs + offset, qe - 1 + offset  # key positions of the block's first and last query
    cuts_causal = causal and ke - 1 > first
    cuts_window = window is not None and (ks < last - window or (not causal and ke - 1 > first + window))
    if not (cuts_causal or cuts_window):
        return None
    return _band(torch.arange(first, last + 1, device=device), torch.arange(ks, ke, device=device), causal, window)


def _band(query_positions: Tensor, key_positions: Tensor, causal: bool, window: int | None) -> Tensor:
    """Boolean (Tq, Tk), True = attend: causality and the sliding window over (Tq,) and (Tk,) positions."""
    distance = query_positions[:, None] - key_positions[None, :]  # (Tq, Tk) how far back each key is
    allowed = distance >= 0 if causal else torch.ones_like(distance, dtype=torch.bool)
    if window is not None:
        allowed = allowed & (distance <= window)
        if not causal:
            allowed = allowed & (distance >= -window)
    return allowed


def _bias_leaves(bias: BlockBias, device: torch.device) -> tuple[Tensor, ...]:
    """The tensors requiring grad that a callable bias reads (its autograd graph's leaves), found on a
    1 x 1 probe: the backward pass returns their gradients, block by block."""
    index = torch.zeros(1, dtype=torch.long, device=device)
    probe = bias(index, index)
    leaves: list[Tensor] = []
    seen: set = set()
    pending = [probe.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf
        if variable is not None:
            leaves.append(variable)
        pending.extend(child for child, _ in node.next_functions)
    return tuple(leaves)


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


def band_mask(
    q_len: int, k_len: int, window: int, *, causal: bool, device: torch.device | str | None = None
) -> Tensor:
    """Boolean (Tq, Tk) mask, True = attend, of a sliding window of ``window`` (W) keys; the queries are
    the last Tq of Tk positions. Causal: query i sees keys i - W .. i; otherwise keys with |i - j| <= W."""
    offset = k_len - q_len
    query_positions = torch.arange(offset, offset + q_len, device=device)
    return _band(query_positions, torch.arange(k_len, device=device), causal, window)


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


@dataclass
class MaskParts:
    """The mask of one forward pass as its parts, for the kernels that never form a (Tq, Tk) matrix.

    ``causal``: the queries are the last Tq of the Tk positions and see keys up to their own.
    ``key_padding_mask`` (B, Tk) bool, True = attend. ``bias``: a ``BlockBias`` over query rows and key
    columns (ALiBi, relative positions), or None. A rolling cache hands the kernel only its last keys:
    ``shifted(start)`` is the same mask for keys from index ``start`` on.
    """

    causal: bool = False
    key_padding_mask: Tensor | None = None
    bias: BlockBias | None = None

    def shifted(self, start: int) -> MaskParts:
        if start == 0:
            return self
        bias = self.bias
        return MaskParts(
            self.causal,
            None if self.key_padding_mask is None else self.key_padding_mask[:, start:],
            None if bias is None else lambda query_index, key_index: bias(query_index, key_index + start),
        )

    def dense(self, q_len: int, k_len: int, window: int | None, dtype: torch.dtype, device: torch.device) -> Tensor:
        """The additive mask (B|1, H|1, Tq, Tk) these parts stand for, with the sliding window's band: for
        the reference path when attention weights are asked for (inspection, not speed)."""
        if window is not None:
            allowed = band_mask(q_len, k_len, window, causal=self.causal, device=device)  # causality included
        elif self.causal:
            allowed = causal_mask(q_len, k_len, device)
        else:
            allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
        allowed = allowed[None, None]
        if self.key_padding_mask is not None:
            allowed = allowed & self.key_padding_mask[:, None, None, :]
        mask = additive_mask(allowed, dtype)
        if self.bias is not None:
            mask = mask + self.bias(torch.arange(q_len, device=device), torch.arange(k_len, device=device)).to(dtype)
        return mask


# ---- key/value cache ------------------------------------------------------------------------


class KVCache:
    """Preallocated keys and values of one attention layer, filled as decoding proceeds.

    Holds only the key/value heads, so grouped- and multi-query models cache less.
    """

    start = 0  # index of the first key ``append`` returns (a rolling cache forgets the oldest)

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


class RollingKVCache(KVCache):
    """The keys and values of the last ``window`` positions only: a sliding window's cache.

    A query sees itself and the W previous positions, so W cached positions are all a step needs:
    ``append`` returns the cached ones followed by the new ones (B, Hkv, held + T, Dh), whose first
    index in the sequence is ``start``, then keeps the last W. Rotary angles are applied before
    caching, so only the order matters. ``length`` counts every position seen; it can be set back
    (``truncate``) only while nothing has been forgotten.
    """

    def __init__(
        self,
        batch_size: int,
        num_kv_heads: int,
        window: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self._length = 0
        super().__init__(batch_size, num_kv_heads, window, head_dim, dtype, device)
        self.start = 0

    @property
    def length(self) -> int:
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        if value != self._length and not (0 <= value <= self._length <= self.max_len):
            raise ValueError(f"a rolling key/value cache of {self.max_len} positions has forgotten positions "
                             f"before {self._length - self.max_len}; it cannot go back to {value} tokens "
                             "(attention_kernel='sliding_window' cannot rewind: no speculative decoding)")
        self._length = value

    @property
    def held(self) -> int:
        """Positions cached now: min(length, window)."""
        return min(self._length, self.max_len)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new keys/values (B, Hkv, T, Dh); return the held ones and these, in order (a copy)."""
        held = self.held
        keys = torch.cat([self.keys[:, :, :held], k], dim=2)  # (B, Hkv, held + T, Dh)
        values = torch.cat([self.values[:, :, :held], v], dim=2)
        keep = min(self.max_len, keys.shape[2])
        self.keys[:, :, :keep] = keys[:, :, -keep:]
        self.values[:, :, :keep] = values[:, :, -keep:]
        self.start = self._length - held
        self._length += k.shape[2]
        return keys, values

    def cached(self) -> tuple[Tensor, Tensor]:
        held = self.held
        return self.keys[:, :, :held], self.values[:, :, :held]

    def grow(self, max_len: int) -> None:
        """Nothing to do: a window's cache never needs more room."""


# ---- multi-head attention -------------------------------------------------------------------


Rotary = tuple[Tensor, Tensor]  # cos, sin: (B, 1, T, Dh)


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with ``num_heads`` query heads sharing ``num_kv_heads`` key/value heads.

    Self-attention projects queries, keys and values with one fused matrix
    ``qkv_proj`` (rows: H*Dh queries, then Hkv*Dh keys, then Hkv*Dh values); cross-attention
    projects queries from the input (``q_proj``) and keys/values from the context (``kv_proj``).

    ``kernel`` (``config.ATTENTION_KERNELS``): ``sdpa`` (``attention``), ``reference``
    (``attention_reference``), ``chunked`` (``chunked_attention``), ``sliding_window``
    (``chunked_attention`` with ``window``: only the key blocks in the band are computed) or ``performer``
    (``performer_attention`` with this module's own ``PerformerProjection``). The last three take the
    mask as ``parts`` (``MaskParts``); given a dense ``mask`` instead, chunked kernels add it as a bias
    and Performer refuses it. Weights (``need_weights``): the chunked kernels compute them on the
    reference path with the same mask (for inspection); Performer has none and refuses.
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
        window: int | None = None,
        performer_features: int = 256,
        performer_redraw_interval: int = 0,
    ) -> None:
        super().__init__()
        if kernel not in ATTENTION_KERNELS:
            raise ValueError(f"kernel={kernel!r} is not one of {', '.join(ATTENTION_KERNELS)}")
        if (kernel == "sliding_window") != (window is not None):
            raise ValueError("window (attention_window) is given with kernel='sliding_window' and only with it")
        if dropout and kernel not in ("sdpa", "reference"):
            raise ValueError(f"kernel={kernel!r} has no attention dropout (dropout={dropout}); "
                             "use 'sdpa' or 'reference'")
        self.num_heads = num_heads
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.head_dim = d_model // num_heads if head_dim is None else head_dim
        self.dropout = dropout
        self.cross = cross
        self.kernel = kernel
        self.window = window
        if kernel == "performer":
            self.performer = PerformerProjection(performer_features, self.head_dim, performer_redraw_interval)
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
        parts: MaskParts | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D); context (cross-attention): (B, S, D). Returns (B, T, D) and weights or None.

        ``mask``/``is_causal`` feed ``sdpa`` and ``reference``; ``parts`` the other kernels."""
        q, k, v = self._project(x, context, cache)
        if rotary is not None:
            cos, sin = rotary
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.cached() if k is None else cache.append(k, v)
        if self.kernel == "sdpa":
            out, weights = attention(
                q, k, v, mask=mask, is_causal=is_causal,
                dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights,
            )
        elif self.kernel == "reference":
            out, weights = attention_reference(q, k, v, mask, is_causal, self.dropout if self.training else 0.0)
            weights = weights if need_weights else None
        else:
            parts = MaskParts(causal=is_causal) if parts is None else parts
            out, weights = self._structured(q, k, v, parts.shifted(0 if cache is None else cache.start), mask,
                                            need_weights)
        batch, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        return self.out_proj(out), weights

    def _structured(
        self, q: Tensor, k: Tensor, v: Tensor, parts: MaskParts, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """The kernels that take the mask as its parts: chunked, sliding_window, performer."""
        if self.kernel == "performer":
            if need_weights:
                raise ValueError("attention_kernel='performer' has no attention weights to return "
                                 "(need_weights / output_attentions); use an exact kernel to inspect them")
            if mask is not None or parts.bias is not None:
                raise ValueError("attention_kernel='performer' cannot add an additive mask or position bias")
            out = performer_attention(q, k, v, self.performer(), causal=parts.causal,
                                      key_padding_mask=parts.key_padding_mask)
            return out, None
        if need_weights:
            dense = parts.dense(q.shape[2], k.shape[2], self.window, q.dtype, q.device)
            return attention_reference(q, k, v, dense if mask is None else dense + mask)
        if mask is not None and parts.bias is not None:
            raise ValueError("give the chunked kernels a position bias as MaskParts.bias or inside mask, not both")
        bias = parts.bias if mask is None else mask
        return chunked_attention(q, k, v, causal=parts.causal, key_padding_mask=parts.key_padding_mask, bias=bias,
                                 window=self.window), None

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

