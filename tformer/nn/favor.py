"""Performer attention (FAVOR+, Choromanski et al. 2021): softmax attention estimated with positive
random features, in time and memory linear in sequence length.

Softmax attention weighs key j for query i by exp(q_i . k_j * scale). With q' = q * scale**0.5 and
k' = k * scale**0.5, exp(q' . k') = E_w[exp(w . q' - |q'|^2 / 2) exp(w . k' - |k'|^2 / 2)] for
w ~ N(0, I), and every term is positive. Stacking M draws of w as the rows of ``projection`` (M, Dh)
gives features phi(x) = exp(x W^T - |x|^2 / 2) (M per position) and the estimate

    out_i = phi(q_i) (sum_j phi(k_j)^T v_j) / phi(q_i) (sum_j phi(k_j)^T)

which never forms the (Tq, Tk) matrix: O(T M Dh) time, and no memory quadratic in T. Orthogonal rows
(Gaussian blocks orthogonalised, each row rescaled to a chi-distributed norm so it is still marginally
N(0, I)) give the same expectation with a lower variance.

Stability: a factor shared by all features of one query, or by all keys a query sees, cancels between
the numerator and the normaliser. So query features are exp(logit - max over that query's features)
(which also drops -|q|^2 / 2 and the usual 1 / sqrt(M)), and key features are exp(logit - a running
max over keys): the max over all valid keys of a sequence and head when not causal, and in the causal
case the max over keys up to the current position (a cumulative max, so no output ever depends on a
later key). Every feature is then at most 1: nothing overflows, whatever the scale of q and k. The
stabilisers are constants to autograd (the output does not depend on them).

Causal attention runs as a scan over query chunks: the state sum_j phi(k_j)^T v_j (M, Dh) and its
normaliser carry the past, each chunk adds its own keys exactly (a masked (chunk, chunk) product).
The forward pass keeps O(chunk^2 + M Dh) per (batch, head) alive; autograd keeps one state per chunk,
so training holds (T / chunk) M Dh per head instead of the T M Dh of a cumulative sum.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer.nn.compiled import load_or_none


def random_features(
    num_features: int,
    head_dim: int,
    *,
    orthogonal: bool = True,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """A projection (M, Dh) whose rows are each distributed N(0, I).

    ``orthogonal``: rows come in blocks of ``head_dim`` mutually orthogonal directions (QR of a
    Gaussian matrix, signs fixed so the rotation is uniformly distributed), each row scaled by the norm
    of an independent Gaussian vector (a chi(Dh) length). Otherwise the rows are i.i.d. Gaussian.
    Drawn on the CPU in float32 from ``generator`` (torch's global RNG when None), then cast to ``dtype``.
    """
    _check_count("num_features", num_features)
    _check_count("head_dim", head_dim)
    if not orthogonal:
        return torch.randn(num_features, head_dim, generator=generator).to(dtype)
    num_blocks = -(-num_features // head_dim)
    gaussian = torch.randn(num_blocks, head_dim, head_dim, generator=generator)
    rotations, triangular = torch.linalg.qr(gaussian)  # columns orthonormal
    rotations = rotations * torch.sign(torch.diagonal(triangular, dim1=-2, dim2=-1)).unsqueeze(-2)
    directions = rotations.transpose(-2, -1).reshape(num_blocks * head_dim, head_dim)[:num_features]
    lengths = torch.randn(num_features, head_dim, generator=generator).norm(dim=-1, keepdim=True)
    return (directions * lengths).to(dtype)


def performer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    projection: Tensor,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
) -> Tensor:
    """FAVOR+ estimate of ``softmax(q k^T * scale) v``.

    q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv), Hkv dividing H (grouped / multi-query
    heads share their key/value head's state). projection: (M, Dh), see ``random_features``.
    key_padding_mask: bool (B, Tk), True = attend; padded keys contribute nothing, and a query that sees
    no key at all gets zeros. ``causal`` with Tq < Tk: the queries are the last Tq positions (a block
    continuing a key/value cache). ``chunk_size``: query positions per step of the causal scan.
    Returns (B, H, Tq, Dv) in q's dtype; features are computed in float32 (or float64 for float64 input).
    """
    _check_inputs(q, k, v, projection, causal, key_padding_mask, scale, chunk_size)
    with _without_autocast(q.device):
        q_features, k_logits, values = _features(q, k, v, projection, key_padding_mask, scale)
        if causal:
            out = _causal(q_features, k_logits, values, chunk_size)[0]
        else:
            out = _bidirectional(q_features, k_logits, values)
    return out.reshape(*q.shape[:3], v.shape[-1]).to(q.dtype)


@dataclass
class PerformerState:
    """What causal Performer attention keeps of the keys seen so far, per sequence and key/value head: the
    running sums over their features, relative to one stabiliser, and the largest key logit so far.

    ``sums`` (B, Hkv, M, Dv + 1) = sum_j phi(k_j)^T [v_j, 1]: the state sum_j phi(k_j)^T v_j and, as the sum
    of a value column of ones, the normaliser sum_j phi(k_j) in its last column, so one product reads both;
    each feature taken relative to ``level`` (B, Hkv); ``raw_max`` (B, Hkv) the running max of the key logits
    (-inf while only padding has been seen), from which later levels continue.
    """

    sums: Tensor
    level: Tensor
    raw_max: Tensor

    def index_select(self, rows: Tensor) -> PerformerState:
        return PerformerState(*(tensor.index_select(0, rows) for tensor in (self.sums, self.level, self.raw_max)))


def performer_decode(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    projection: Tensor,
    state: PerformerState | None,
    *,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
) -> tuple[Tensor, PerformerState]:
    """Causal Performer attention of T new positions after the keys ``state`` summarises (None: none):
    q (B, H, T, Dh) and the new keys and values (B, Hkv, T, Dh); ``key_padding_mask`` (B, T) for the new
    keys. Returns the output (B, H, T, Dv), what ``performer_attention`` gives these queries over all the
    keys (to rounding), and the state after them: a decoding step costs O(M Dh), whatever the length."""
    _check_inputs(q, k, v, projection, True, key_padding_mask, scale, chunk_size)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"performer_decode: the new queries ({q.shape[2]}) and keys ({k.shape[2]}) are the same "
                         "positions")
    return decode_unchecked(q, k, v, projection, state, key_padding_mask, scale, chunk_size)


def decode_unchecked(q: Tensor, k: Tensor, v: Tensor, projection: Tensor, state: PerformerState | None,
                     key_padding_mask: Tensor | None = None, scale: float | None = None,
                     chunk_size: int = 64) -> tuple[Tensor, PerformerState]:
    """``performer_decode`` for inputs its caller has checked (a decoding cache, every step): one new real
    position after a state, the common step, is computed directly (``decode_one``)."""
    if state is not None and q.shape[2] == 1 and key_padding_mask is None:
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return decode_one(q, k, v, projection_for_decoding(projection, state.sums.dtype, scale), state, scale)
    with _without_autocast(q.device):
        q_features, k_logits, values = _features(q, k, v, projection, key_padding_mask, scale)
        out, state = _causal(q_features, k_logits, values, chunk_size, state)
    return out.reshape(*q.shape[:3], v.shape[-1]).to(q.dtype), state


def projection_for_decoding(projection: Tensor, dtype: torch.dtype, scale: float) -> Tensor:
    """The projection as ``decode_one`` multiplies by it: (Dh, M) contiguous, times scale**0.5 (q' = q * scale**0.5)."""
    return (projection.to(dtype).t() * scale ** 0.5).contiguous()


def _without_autocast(device: torch.device):
    """Autocast off for the features (float32 at least), or nothing to do when it is not on."""
    return torch.autocast(device.type, enabled=False) if torch.is_autocast_enabled(device.type) else nullcontext()


def _features(q: Tensor, k: Tensor, v: Tensor, projection: Tensor, key_padding_mask: Tensor | None,
              scale: float | None) -> tuple[Tensor, Tensor, Tensor]:
    """Query features (B, Hkv, G, Tq, M), each query's relative to its own max; key logits (B, Hkv, Tk, M),
    -inf for padded keys; values with a column of ones after them (B, Hkv, Tk, Dv + 1), whose sums under the
    key features are the normaliser; in float32 (float64 for float64 input)."""
    batch, heads, q_len, head_dim = q.shape
    kv_heads = k.shape[1]
    scale = head_dim ** -0.5 if scale is None else scale
    compute = torch.promote_types(q.dtype, torch.float32)
    weights = projection.to(device=q.device, dtype=compute).T  # (Dh, M)
    # q' = q * scale**0.5, query heads of one group side by side: (B, Hkv, G, Tq, Dh).
    q_scaled = q.to(compute).reshape(batch, kv_heads, heads // kv_heads, q_len, head_dim) * scale ** 0.5
    q_logits = q_scaled @ weights  # (B, Hkv, G, Tq, M)
    q_features = torch.exp(q_logits - q_logits.detach().amax(-1, keepdim=True))
    k_scaled = k.to(compute) * scale ** 0.5
    k_logits = k_scaled @ weights - k_scaled.square().sum(-1, keepdim=True) / 2  # (B, Hkv, Tk, M)
    if key_padding_mask is not None:
        k_logits = k_logits.masked_fill(~key_padding_mask[:, None, :, None], float("-inf"))
    return q_features, k_logits, _with_ones(v.to(compute))


def _with_ones(values: Tensor) -> Tensor:
    """(..., Dv) -> (..., Dv + 1): a last column of ones, so one product gives a sum and its normaliser."""
    return torch.nn.functional.pad(values, (0, 1), value=1.0)


def _bidirectional(q_features: Tensor, k_logits: Tensor, values: Tensor) -> Tensor:
    """Every query sees every key: phi(Q) (phi(K)^T V) / phi(Q) (phi(K)^T 1), ``values`` with their column of
    ones. Returns (B, Hkv, G, Tq, Dv)."""
    stabiliser = _finite_or_zero(k_logits.detach().amax(dim=(-2, -1), keepdim=True))  # (B, Hkv, 1, 1)
    k_features = torch.exp(k_logits - stabiliser)  # (B, Hkv, Tk, M), padded keys 0
    sums = (k_features.transpose(-2, -1) @ values).unsqueeze(2)  # (B, Hkv, 1, M, Dv + 1)
    return _normalised(q_features @ sums)


def _causal(q_features: Tensor, k_logits: Tensor, values: Tensor, chunk_size: int,
            carried: PerformerState | None = None) -> tuple[Tensor, PerformerState]:
    """Query i (the last Tq of Tk positions) sees keys j <= its position: a scan over query chunks, after
    the keys ``carried`` summarises (then Tq == Tk); ``values`` with their column of ones. Returns
    (B, Hkv, G, Tq, Dv) and the state after it.

    Every quantity of position i is kept relative to ``running[i]``, the max key logit up to i, so a
    query's output depends on no later key (bitwise) and no feature exceeds 1.
    """
    q_len, k_len = q_features.shape[-2], k_logits.shape[-2]
    offset = k_len - q_len
    raw = k_logits.detach().amax(-1).cummax(-1).values  # (B, Hkv, Tk)
    if carried is not None:
        raw = torch.maximum(raw, carried.raw_max[..., None])
    running = _finite_or_zero(raw)
    batch, kv_heads, _, num_features = k_logits.shape
    if carried is not None:
        sums, carried_max = carried.sums, carried.level
    # The keys before the first query (a cached prefix) enter as the initial sums, relative to their max.
    elif offset > 0:
        carried_max = running[..., offset - 1]  # (B, Hkv)
        prefix = torch.exp(k_logits[..., :offset, :] - carried_max[..., None, None])  # (B, Hkv, offset, M)
        sums = prefix.transpose(-2, -1) @ values[..., :offset, :]  # (B, Hkv, M, Dv + 1)
    else:
        carried_max = running[..., 0]
        sums = values.new_zeros(batch, kv_heads, num_features, values.shape[-1])
    if q_len == 0:
        empty = q_features.new_zeros(*q_features.shape[:-1], values.shape[-1] - 1)
        return empty, PerformerState(sums, carried_max, raw[..., -1] if k_len else carried.raw_max)
    size = min(chunk_size, q_len)
    below = torch.ones(size, size, dtype=torch.bool, device=k_logits.device).tril()  # key j <= query i
    # Chunks by split, not by slicing in the loop: a slice's backward writes a zero tensor of the whole
    # input, which would make the backward quadratic in length.
    chunks = zip(q_features.split(chunk_size, dim=-2), k_logits[..., offset:, :].split(chunk_size, dim=-2),
                 values[..., offset:, :].split(chunk_size, dim=-2), running[..., offset:].split(chunk_size, dim=-1),
                 strict=True)
    outputs = []
    for q_chunk, chunk_logits, chunk_values, level in chunks:
        # q_chunk (B, Hkv, G, c, M); chunk_logits (B, Hkv, c, M); chunk_values (B, Hkv, c, Dv + 1); level (B, Hkv, c)
        length = level.shape[-1]
        k_features = torch.exp(chunk_logits - level[..., None])  # each <= 1
        # Within the chunk: key j for query i, rescaled from level j to level i (<= 1 for j <= i), 0 above.
        decay = torch.exp((level[..., None, :] - level[..., :, None]).clamp(max=0))  # (B, Hkv, c, c)
        decay = decay * below[:length, :length]
        scores = (q_chunk @ k_features.transpose(-2, -1).unsqueeze(2)) * decay.unsqueeze(2)  # (B, Hkv, G, c, c)
        # The sums, brought from the carried level to each query's level.
        q_carry = q_chunk * torch.exp((carried_max[..., None] - level).clamp(max=0))[:, :, None, :, None]
        outputs.append(_normalised(scores @ chunk_values.unsqueeze(2) + q_carry @ sums.unsqueeze(2)))
        # Add this chunk's keys to the sums, everything at the chunk's last level.
        last = level[..., -1]  # (B, Hkv)
        to_last = k_features * torch.exp((level - last[..., None]).clamp(max=0))[..., None]
        carry = torch.exp((carried_max - last).clamp(max=0))
        sums = sums * carry[..., None, None] + to_last.transpose(-2, -1) @ chunk_values
        carried_max = last
    return torch.cat(outputs, dim=-2), PerformerState(sums, carried_max, raw[..., -1])


def decode_one(q: Tensor, k: Tensor, v: Tensor, weights: Tensor, carried: PerformerState,
               scale: float) -> tuple[Tensor, PerformerState]:
    """One new real position after ``carried`` (see ``decode_one_tensors``), with ``weights`` from
    ``projection_for_decoding``: on the CPU, the compiled one-pass step (``nn/kernels/performer_decode.cpp``),
    which reads and writes the sums once; elsewhere, or where it cannot be built, the tensor operations."""
    kernels = load_or_none() if q.device.type == "cpu" and weights.dtype in (torch.float32, torch.float64) else None
    if kernels is None:
        return decode_one_tensors(q, k, v, weights, carried, scale)
    dtype = weights.dtype
    out, level = kernels.performer_decode(q.to(dtype), k.to(dtype), v.to(dtype), weights, carried.sums,
                                          carried.level.contiguous(), scale)
    return out.to(q.dtype), PerformerState(carried.sums, level, level)


def decode_one_tensors(q: Tensor, k: Tensor, v: Tensor, weights: Tensor, carried: PerformerState,
               scale: float) -> tuple[Tensor, PerformerState]:
    """One new real position after ``carried``, with ``weights`` from ``projection_for_decoding`` for ``scale`` (the
    score scale, 1 / sqrt(Dh) by default): ``_causal``'s arithmetic for a chunk of one (whose decay is 1), as
    batched products over the (batch, key/value head) pairs, the carried sums updated in place (the cache
    owns them). The running max never falls, so the sums are brought to a new level only when it rises,
    which after the first tokens is rare; and the output reads the updated sums, since
    q' (S c + phi(k)^T v) = (q' c) S + (q' . phi(k)) v is what ``_causal`` computes. A query's features are
    its softmax over them: a factor shared by all of one query's features cancels in the ratio.
    Returns (B, H, 1, Dv) and the state."""
    batch, heads, _, head_dim = q.shape
    kv_heads, width = k.shape[1], v.shape[-1]
    group, rows, features = heads // kv_heads, batch * kv_heads, weights.shape[1]
    out_dtype = q.dtype
    if q.dtype != weights.dtype:
        q, k, v = q.to(weights.dtype), k.to(weights.dtype), v.to(weights.dtype)
    keys = k.reshape(rows, 1, head_dim)
    # The queries' and the key's logits in one product: (rows, G + 1, M), the key's in the last row.
    logits = torch.cat([q.reshape(rows, group, head_dim), keys], 1).view(-1, head_dim).mm(weights)
    logits = logits.view(rows, group + 1, features)
    q_features = torch.softmax(logits[:, :group], -1)  # (rows, G, M)
    k_logits = logits[:, group:].sub_(torch.bmm(keys, keys.transpose(1, 2)), alpha=scale / 2)  # k'W^T - |k'|^2/2
    level = carried.level.view(rows, 1, 1)
    raw = torch.maximum(level, k_logits.amax(-1, keepdim=True))  # finite: a real key
    sums = carried.sums.view(rows, features, width + 1)
    if not torch.equal(raw, level):  # the running max rose
        sums.mul_(torch.exp(level - raw))  # the carried sums brought to the new level
    k_features = k_logits.sub_(raw).exp_().transpose(1, 2)  # (rows, M, 1), each <= 1
    sums.addcmul_(k_features, _with_ones(v.reshape(rows, 1, width)))  # + phi(k)^T [v, 1]
    out = _normalised(torch.bmm(q_features, sums))  # (rows, G, Dv)
    new_level = raw.view(batch, kv_heads)
    return out.view(batch, heads, 1, width).to(out_dtype), PerformerState(carried.sums, new_level, new_level)


def _finite_or_zero(stabiliser: Tensor) -> Tensor:
    """-inf (only padded keys so far) becomes 0, so subtracting it keeps those features at exactly 0."""
    return torch.where(torch.isfinite(stabiliser), stabiliser, torch.zeros_like(stabiliser))


def _normalised(sums: Tensor) -> Tensor:
    """(..., Dv + 1) -> (..., Dv): the sums over the values divided by the last column's (the normaliser's),
    with 0 (not NaN) for a query that saw no key (normaliser 0)."""
    return sums[..., :-1] / sums[..., -1:].clamp_min(torch.finfo(sums.dtype).tiny)


class PerformerProjection(nn.Module):
    """The random projection (M, Dh) of one attention layer, redrawn every ``redraw_interval`` training steps.

    Both buffers are persistent, so checkpoints and a bitwise resume carry them: ``projection`` and
    ``steps_since_redraw`` (int64 scalar: training forwards that used the current projection). Each
    projection serves exactly ``redraw_interval`` training forwards; a redraw uses torch's global CPU
    RNG (which the trainer saves). Evaluation mode, and ``redraw_interval == 0``, never redraw or count.
    """

    def __init__(self, num_features: int, head_dim: int, redraw_interval: int = 0) -> None:
        super().__init__()
        _check_count("num_features", num_features)
        _check_count("head_dim", head_dim)
        if isinstance(redraw_interval, bool) or not isinstance(redraw_interval, int) or redraw_interval < 0:
            raise ValueError(f"redraw_interval must be an int >= 0 (0 = never redraw), got {redraw_interval!r}")
        self.redraw_interval = redraw_interval
        self.register_buffer("projection", random_features(num_features, head_dim))
        self.register_buffer("steps_since_redraw", torch.zeros((), dtype=torch.int64))
        # A host copy of the counter, so counting never waits on the device; re-read after a load.
        self._steps: int | None = 0
        self.register_load_state_dict_post_hook(_forget_host_steps)

    def forward(self) -> Tensor:
        """The current projection (M, Dh); in training mode, one more step counted (and a redraw when due)."""
        if self.training and self.redraw_interval > 0:
            if self._steps is None:
                self._steps = int(self.steps_since_redraw)
            if self._steps >= self.redraw_interval:
                self.redraw()
            self._steps += 1
            self.steps_since_redraw.fill_(self._steps)
        return self.projection

    @torch.no_grad()
    def redraw(self) -> None:
        """A fresh orthogonal projection from the global RNG, in place; the step count restarts at 0."""
        num_features, head_dim = self.projection.shape
        self.projection.copy_(random_features(num_features, head_dim))
        self._steps = 0
        self.steps_since_redraw.zero_()

    def extra_repr(self) -> str:
        num_features, head_dim = self.projection.shape
        return f"num_features={num_features}, head_dim={head_dim}, redraw_interval={self.redraw_interval}"


def _forget_host_steps(module: PerformerProjection, incompatible_keys) -> None:
    module._steps = None


# ---- input checks ---------------------------------------------------------------------------


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, projection: Tensor, causal: bool,
                  key_padding_mask: Tensor | None, scale: float | None, chunk_size: int) -> None:
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dim() != 4:
            raise ValueError(f"performer_attention: {name} must be (B, H, T, Dh), got shape {tuple(tensor.shape)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"performer_attention: k {tuple(k.shape)} and v {tuple(v.shape)} differ in (B, Hkv, Tk)")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"performer_attention: q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head size")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"performer_attention: {k.shape[1]} key/value heads do not divide {q.shape[1]} query heads")
    if projection.dim() != 2 or projection.shape[0] < 1 or projection.shape[1] != q.shape[3]:
        raise ValueError(f"performer_attention: projection must be (num_features >= 1, head_dim {q.shape[3]}), "
                         f"got shape {tuple(projection.shape)}")
    if key_padding_mask is not None and (key_padding_mask.dtype != torch.bool
                                         or key_padding_mask.shape != (k.shape[0], k.shape[2])):
        raise ValueError(f"performer_attention: key_padding_mask must be bool (B, Tk) = {(k.shape[0], k.shape[2])}, "
                         f"True = attend; got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(f"performer_attention: causal needs at most as many queries as keys, "
                         f"got {q.shape[2]} queries and {k.shape[2]} keys")
    if scale is not None and not scale > 0:
        raise ValueError(f"performer_attention: scale must be > 0, got {scale}")
    _check_count("chunk_size", chunk_size)
