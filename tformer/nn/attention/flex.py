"""The ``flex`` kernel: exact softmax attention through PyTorch's FlexAttention, the pass's mask (causality,
padding, packed examples, a sliding window) as a mask function of (batch, head, query, key) indices and the
position bias and soft cap as a score function, so that one fused kernel takes what ``sdpa`` can only take as a
dense additive mask or not at all (ALiBi, relative buckets, windows, document masks, Gemma 2's capped scores).

On a GPU FlexAttention compiles that kernel (``torch.compile``; after a second length, for any length) and skips
the key blocks the mask rules out; kernels that declare ``gpu_flex`` send such passes there (``routes_to_flex``).
On the CPU PyTorch runs FlexAttention unfused and forward only (it has no backward pass there): it gives the same
outputs, which is what the CPU tests check, and training with it on the CPU is refused before the first step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from tformer.nn.attention.kernel import AttentionKernel
from tformer.nn.attention.mask import AttentionMask
from tformer.nn.attention.reference import reference_with_mask

try:  # PyTorch >= 2.5
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:  # pragma: no cover - the pinned PyTorch has it
    flex_attention = create_block_mask = BlockMask = None

MaskFunction = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # (b, h, q_idx, kv_idx) -> bool, True = attend
ScoreFunction = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]  # (score, b, h, q_idx, kv_idx) -> score

_compiled: dict[str, Callable] = {}  # device type -> FlexAttention compiled for it (CUDA only; see flex_attend)


def flex_available() -> bool:
    """Whether this PyTorch has FlexAttention."""
    return flex_attention is not None


def mask_function(mask: AttentionMask, q_len: int, k_len: int, window: int | None) -> MaskFunction | None:
    """The keys each query may see as a function of indices: the queries are the last ``q_len`` of the ``k_len``
    keys (a block continuing a cache); causality (one query sees every key), key padding (B, Tk), packed segments
    (B, Tk) and a band of ``window`` keys (causal: i - W .. i; otherwise |i - j| <= W). None: every key."""
    offset = k_len - q_len
    causal = mask.causal and q_len > 1
    padding, segments = mask.key_padding, mask.segments
    if not causal and padding is None and segments is None and window is None:
        return None

    def allowed(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        position = q_idx + offset  # the query's index among the keys
        keep = kv_idx <= position if causal else kv_idx >= 0
        if window is not None:
            keep = keep & (position - kv_idx <= window)
            if not mask.causal:
                keep = keep & (kv_idx - position <= window)
        if padding is not None:
            keep = keep & padding[b, kv_idx]
        if segments is not None:
            keep = keep & (segments[b, position] == segments[b, kv_idx])
        return keep

    return allowed


def score_function(mask: AttentionMask, softcap: float | None, dtype: torch.dtype) -> ScoreFunction | None:
    """What is done to each scaled score: capped to ``cap * tanh(score / cap)``, then the position bias of its
    query and key added (the bias (B|1, H, Tq, Tk) computed once for the pass, as the dense mask holds it). None:
    nothing."""
    bias = None
    if mask.position_bias is not None:
        bias = mask.position_bias(mask.query_positions, mask.key_positions).to(dtype)  # (B|1, H, Tq, Tk)
    if bias is None and softcap is None:
        return None
    per_row = bias is not None and bias.shape[0] > 1

    def modified(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        if softcap is not None:
            score = torch.tanh(score / softcap) * softcap
        if bias is not None:
            score = score + bias[b if per_row else 0, h, q_idx, kv_idx]
        return score

    return modified


def flex_attend(q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, *, scale: float | None = None,
                softcap: float | None = None, window: int | None = None) -> Tensor:
    """Attention of q (B, H, Tq, Dh) over k, v (B, Hkv, Tk, Dh) under ``mask`` (and a ``window``), its scores
    scaled by ``scale`` (None: head_dim**-0.5) and capped at ``softcap``: (B, H, Tq, Dh); a query that sees no key
    gets zeros. The block mask and the score function are made once per pass and shared by its layers."""
    if not flex_available():
        raise RuntimeError("FlexAttention needs PyTorch >= 2.5 (torch.nn.attention.flex_attention)")
    if q.device.type == "cpu" and (q.requires_grad or k.requires_grad or v.requires_grad):
        if torch.is_grad_enabled():
            raise ValueError("attention_kernel='flex' has no backward pass on the CPU (PyTorch's FlexAttention is "
                             "forward only there): train with 'sdpa' on the CPU, 'flex' on a GPU")
        q, k, v = q.detach(), k.detach(), v.detach()  # no gradient wanted: PyTorch refuses inputs that could have one
    q_len, k_len = q.shape[2], k.shape[2]
    key = ("flex", q_len, k_len, window, softcap, q.dtype, q.device)
    if key not in mask._derived:
        allowed = mask_function(mask, q_len, k_len, window)
        rows = None if mask.key_padding is None and mask.segments is None else q.shape[0]
        block_mask = None if allowed is None else create_block_mask(allowed, rows, None, q_len, k_len,
                                                                     device=q.device)
        mask._derived[key] = block_mask, score_function(mask, softcap, q.dtype)
    block_mask, modified = mask._derived[key]
    return flex_for(q.device)(q, k, v, score_mod=modified, block_mask=block_mask, scale=scale,
                               enable_gqa=k.shape[1] != q.shape[1])


def flex_for(device: torch.device) -> Callable:
    """FlexAttention as it runs on ``device``: compiled on a GPU (its point: one fused kernel), as PyTorch runs it
    eagerly on the CPU (unfused, the same function; its warning that it is unfused said here once)."""
    if device.type == "cpu":
        def eager(*args, **kwargs) -> Tensor:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
                return flex_attention(*args, **kwargs)

        return eager
    if device.type not in _compiled:
        _compiled[device.type] = torch.compile(flex_attention)  # a second length makes it dynamic (no recompiles)
    return _compiled[device.type]


def needs_flex(mask: AttentionMask, softcap: float | None = None, window: int | None = None) -> bool:
    """Whether a pass holds what the fused sdpa kernel cannot take natively: a position bias, packed segments, a
    cap on the scores, a window (causality and padding it takes)."""
    return mask.position_bias is not None or mask.segments is not None or softcap is not None or window is not None


def routes_to_flex(kernel: AttentionKernel, q: Tensor, mask: AttentionMask, softcap: float | None = None,
                   window: int | None = None) -> bool:
    """Whether ``kernel`` sends this pass through FlexAttention: when it declares ``gpu_flex``, on CUDA, when
    ``needs_flex``, for more than one query a sequence (a one-query decoding step reads its one dense row cheaply,
    and a block mask made at every step would cost more than it saves)."""
    return (kernel.gpu_flex and q.device.type == "cuda" and q.shape[2] > 1 and flex_available()
            and needs_flex(mask, softcap, window))


class FlexKernel(AttentionKernel):
    """Exact softmax attention through FlexAttention (see the module doc): causality, padding, packed examples,
    position biases, soft-capping and another scale in one kernel; weights (on the reference path when asked for);
    no dropout; on the CPU forward only."""

    name = "flex"
    segments = True
    softcap = True
    reads_pages = True
    trains_on_cpu = False

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, *, dropout_p: float = 0.0,
                 need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if need_weights:
            return reference_with_mask(q, k, v, mask, dropout_p, scale=self.scale, softcap=self.cap)
        return flex_attend(q, k, v, mask, scale=self.scale, softcap=self.cap), None
