"""The ``chunked`` kernel: exact softmax attention over blocks of queries and keys with a running
(online) softmax, so no (Tq, Tk) matrix is formed and memory grows linearly in length
(FlashAttention's recipe), with a backward pass that recomputes each block."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tformer.nn.attention.flex import flex_attend, routes_to_flex
from tformer.nn.attention.kernel import AttentionKernel
from tformer.nn.attention.mask import AttentionMask, BlockBias, additive_mask, band
from tformer.nn.attention.reference import attention_reference

QUERY_BLOCK = KEY_BLOCK = 128  # the block sizes of the kernel (and of chunked_attention's defaults)


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    bias: Tensor | BlockBias | None = None,
    scale: float | None = None,
    query_block: int = QUERY_BLOCK,
    key_block: int = KEY_BLOCK,
    window: int | None = None,
    softcap: float | None = None,
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
    may see no key gets 0. ``softcap`` (c): the scaled scores become c * tanh(scores / c) before the bias
    and mask (Gemma 2). The backward pass recomputes each block's scores from the saved output
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
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap={softcap!r} must be None or a number > 0")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (batch, k_len):
        raise ValueError(f"key_padding_mask has shape {tuple(key_padding_mask.shape)}, expected ({batch}, {k_len})")
    spec = _ChunkSpec(causal, 1.0 / math.sqrt(head_dim) if scale is None else scale, query_block, key_block,
                      window, bias if callable(bias) else None, softcap)
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
    softcap: float | None = None


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
                scores, bias_block, cap_slope = _block_scores(q5, k5, qs, qe, ks, ke, key_padding_mask, bias, spec,
                                                              keep_graph=bool(leaves))
                probabilities = torch.exp(scores - lse[..., qs:qe, None])  # (B, Hkv, G, tq, tk)
                grad_v[:, :, ks:ke] += torch.matmul(probabilities.transpose(-2, -1), grad_rows).sum(2)
                grad_p = torch.matmul(grad_rows, v5[..., ks:ke, :].transpose(-2, -1).to(compute))
                grad_scores = probabilities * (grad_p - delta[..., qs:qe, :])  # (B, Hkv, G, tq, tk)
                grad_raw = grad_scores if cap_slope is None else grad_scores * cap_slope  # through the cap
                grad_q[..., qs:qe, :] += torch.matmul(grad_raw, k5[..., ks:ke, :].to(compute)) * spec.scale
                grad_k[:, :, ks:ke] += (torch.matmul(grad_raw.transpose(-2, -1), q_rows.to(compute)).sum(2)
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
    """Scaled (and capped) scores of one block (B, Hkv, G, tq, tk) plus bias, -inf where a query may not look;
    the callable bias's block (1|B, H, tq, tk) with its graph when ``keep_graph`` (else None); and the cap's
    slope d capped / d scores = 1 - tanh^2 when ``spec.softcap`` (else None)."""
    compute = _compute_dtype(q5.dtype)
    scores = torch.matmul(q5[..., qs:qe, :], k5[..., ks:ke, :].transpose(-2, -1)).to(compute) * spec.scale
    cap_slope = None
    if spec.softcap is not None:
        capped = torch.tanh(scores / spec.softcap)
        cap_slope = 1 - capped * capped
        scores = capped * spec.softcap
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
    return scores, bias_block if keep_graph else None, cap_slope


def _block_allowed(qs, qe, ks, ke, offset, causal, window, device) -> Tensor | None:
    """Boolean (tq, tk), True = attend, of one block by position; None when every pair is allowed."""
    first, last = qs + offset, qe - 1 + offset  # key positions of the block's first and last query
    cuts_causal = causal and ke - 1 > first
    cuts_window = window is not None and (ks < last - window or (not causal and ke - 1 > first + window))
    if not (cuts_causal or cuts_window):
        return None
    return band(torch.arange(first, last + 1, device=device), torch.arange(ks, ke, device=device), causal, window)


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




class ChunkedKernel(AttentionKernel):
    """Exact softmax attention in blocks (``chunked_attention``): O(T^2) time, O(T) memory, no dropout.

    Attention weights, when asked for, come from the reference path under the same mask (for
    inspection). Without gradients, a pass whose whole (Tq, Tk) product fits in one block (a decoding
    step, a short prompt) runs as that one block through the fused kernel: the same function, with
    no more memory than a block takes.
    """

    name = "chunked"
    softcap = True
    reads_pages = True
    gpu_flex = True
    window: int | None = None  # a sliding window (W keys each side, or back when causal); None: none

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, *, dropout_p: float = 0.0,
                 need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        q_len, k_len = q.shape[2], k.shape[2]
        # A window that reaches every key (no two positions further apart than W) excludes nothing.
        window = self.window if self.window is not None and k_len - 1 > self.window else None
        if need_weights:  # written out under the pass's whole mask; a row the band and padding leave blind: zeros
            additive, empty = _whole_mask(mask, q_len, k_len, window, q.dtype, q.device)
            out, weights = attention_reference(q, k, v, additive, dropout_p=dropout_p, scale=self.scale,
                                               softcap=self.cap)
            return (out, weights) if empty is None else (out.masked_fill(empty, 0.0), weights.masked_fill(empty, 0.0))
        if routes_to_flex(self, q, mask, self.cap, window):  # on a GPU: one fused kernel that skips the masked blocks
            return flex_attend(q, k, v, mask, scale=self.scale, softcap=self.cap, window=window), None
        if not torch.is_grad_enabled() and q_len * k_len <= QUERY_BLOCK * KEY_BLOCK:
            return self._one_block(q, k, v, mask, window), None
        return chunked_attention(q, k, v, causal=mask.causal, key_padding_mask=mask.key_padding, bias=mask.bias,
                                 scale=self.scale, window=window, softcap=self.cap), None

    def _one_block(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, window: int | None) -> Tensor:
        """The whole pass as one block, through the fused kernel (written out when the scores are capped): its
        mask (causality, the window, padding, the position bias) built once per pass and shared by every layer;
        rows that see no key get 0."""
        additive, empty = _whole_mask(mask, q.shape[2], k.shape[2], window, q.dtype, q.device)
        if self.cap is not None:
            out = attention_reference(q, k, v, additive, scale=self.scale, softcap=self.cap)[0]
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, scale=self.scale,
                                                 enable_gqa=k.shape[1] != q.shape[1])
        return out if empty is None else out.masked_fill(empty, 0.0)


def _whole_mask(mask: AttentionMask, q_len: int, k_len: int, window: int | None, dtype: torch.dtype,
                device: torch.device) -> tuple[Tensor | None, Tensor | None]:
    """The additive mask (B|1, 1|H, Tq, Tk) of one block holding the whole pass (causality, the window, padding,
    the position bias), and its rows that see no key (B|1, 1, Tq, 1) or None: built once per pass, shared by every
    layer."""
    key = ("one block", q_len, k_len, dtype, window)
    if key not in mask._derived:
        mask._derived[key] = _block_mask(mask, q_len, k_len, window, dtype, device)
    return mask._derived[key]


def _block_mask(mask: AttentionMask, q_len: int, k_len: int, window: int | None, dtype: torch.dtype,
                device: torch.device) -> tuple[Tensor | None, Tensor | None]:
    """``_whole_mask``, built."""
    offset = k_len - q_len
    allowed = None
    if window is not None or (mask.causal and q_len > 1):
        query_positions = torch.arange(offset, k_len, device=device)
        allowed = band(query_positions, torch.arange(k_len, device=device), mask.causal, window)[None, None]
    if mask.key_padding is not None:
        padding = mask.key_padding[:, None, None, :]
        allowed = padding if allowed is None else allowed & padding
    additive = None if allowed is None else additive_mask(allowed, dtype)
    if mask.position_bias is not None:
        bias = mask.position_bias(mask.query_positions, mask.key_positions).to(dtype)
        additive = bias if additive is None else additive + bias
    empty = None
    if allowed is not None and not mask.real_queries:
        empty = ~allowed.any(-1, keepdim=True)  # (B|1, 1, Tq, 1)
    return additive, empty
