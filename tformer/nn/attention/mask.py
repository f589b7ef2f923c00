"""The one mask convention of every attention kernel, and the layout of a pass's tokens it is built from.

``AttentionMask`` says which keys each query may see and what is added to its scores: causality
(the queries are the last Tq of the Tk key positions, each seeing keys up to its own), padding of
the keys ``(B, Tk)`` (True = a real token), packed sequences (``segments`` (B, Tk): a query sees only the keys
of its own segment, several examples sharing a row), and a position bias (ALiBi, relative buckets) as a
function of query and key positions. Kernels that form the (Tq, Tk) scores read it as one additive
tensor (``dense``: 0 where a query may look, the dtype's most negative finite number where it may
not, plus the bias), built once per pass and shared by every layer; the others read its parts. A
query that may see no key at all (a left-padding row) gets zeros from every kernel (``empty_rows``),
so switching the kernel never changes a result.

``StepLayout`` is what the caller of a pass knows: the new tokens' positions, every key's position
and padding, and which rows it wants back. A stack's forward makes it from ``attention_mask``; a
decoding session and the serving engine make it from their own tables, once per step, unchecked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

# bias(query_index (tq,), key_index (tk,)) -> additive bias (1|B, H, tq, tk) of those rows and columns.
BlockBias = Callable[[Tensor, Tensor], Tensor]
# position_bias(query_positions (B, Tq), key_positions (B, Tk)) -> additive bias (B, H, Tq, Tk): ALiBi, relative.
PositionBias = Callable[[Tensor, Tensor], Tensor]


def causal_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean (Tq, Tk) mask, True = attend: query i (the last Tq of Tk positions) sees keys <= its own."""
    offset = k_len - q_len
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + offset
    k_pos = torch.arange(k_len, device=device).unsqueeze(0)
    return k_pos <= q_pos


def band(query_positions: Tensor, key_positions: Tensor, causal: bool, window: int | None) -> Tensor:
    """Boolean (Tq, Tk), True = attend: causality and a sliding window over (Tq,) and (Tk,) positions."""
    distance = query_positions[:, None] - key_positions[None, :]  # (Tq, Tk) how far back each key is
    allowed = distance >= 0 if causal else torch.ones_like(distance, dtype=torch.bool)
    if window is not None:
        allowed = allowed & (distance <= window)
        if not causal:
            allowed = allowed & (distance >= -window)
    return allowed


def band_mask(
    q_len: int, k_len: int, window: int, *, causal: bool, device: torch.device | str | None = None
) -> Tensor:
    """Boolean (Tq, Tk) mask, True = attend, of a sliding window of ``window`` (W) keys; the queries are
    the last Tq of Tk positions. Causal: query i sees keys i - W .. i; otherwise keys with |i - j| <= W."""
    offset = k_len - q_len
    query_positions = torch.arange(offset, offset + q_len, device=device)
    return band(query_positions, torch.arange(k_len, device=device), causal, window)


def padding_mask(attention_mask: Tensor) -> Tensor:
    """Boolean (B, 1, 1, Tk) mask from an ``attention_mask`` (B, Tk) with 1 = attend."""
    return attention_mask.bool()[:, None, None, :]


def additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where ``allowed`` is True, the most negative finite value of ``dtype`` elsewhere.

    A finite value keeps fully masked rows free of NaN; their output is then set to zero."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


@dataclass(eq=False)
class AttentionMask:
    """Which keys each query may see, and the position bias of its scores: one pass's mask.

    ``causal``: the queries are the last Tq of the Tk positions and see keys up to their own.
    ``key_padding`` (B, Tk) bool, True = a real key (None: none padded). ``segments`` (B, Tk) integers: the
    example each key belongs to when several are packed into a row; a query (one of the last Tq) sees only keys
    of its own segment (None: one example a row). ``position_bias`` with
    ``query_positions`` (B, Tq) and ``key_positions`` (B, Tk): an additive bias by position (None:
    none). ``real_queries``: the caller knows every query is a real token (none is padding), so each sees at
    least itself and no row needs zeroing. One object serves every layer of a pass: what it derives (the
    dense form, the empty rows) is computed once and kept.
    """

    causal: bool = False
    key_padding: Tensor | None = None
    query_positions: Tensor | None = None
    key_positions: Tensor | None = None
    position_bias: PositionBias | None = None
    real_queries: bool = False
    segments: Tensor | None = None
    _derived: dict = field(default_factory=dict, repr=False)

    @property
    def bias(self) -> BlockBias | None:
        """The position bias of a block of query rows and key columns, or None (see ``BlockBias``)."""
        if self.position_bias is None:
            return None
        position_bias, queries, keys = self.position_bias, self.query_positions, self.key_positions

        def block_bias(query_index: Tensor, key_index: Tensor) -> Tensor:
            return position_bias(queries[:, query_index], keys[:, key_index])

        return block_bias

    def dense(self, q_len: int, k_len: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor | None, bool]:
        """The additive mask (B|1, 1|H, Tq, Tk), and whether a fused kernel may use ``is_causal`` instead
        of it (plain causality over equal lengths); (None, False) when every query sees every key."""
        key = (q_len, k_len, dtype)
        found = self._derived.get(key)
        if found is None:
            found = self._derived[key] = self._dense(q_len, k_len, dtype, device)
        return found

    def _dense(self, q_len: int, k_len: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor | None, bool]:
        causal = self.causal and q_len > 1  # one query, the last position, sees every key
        if self.key_padding is None and self.position_bias is None and self.segments is None:
            if not causal:
                return None, False
            if q_len == k_len:
                return None, True
        allowed = causal_mask(q_len, k_len, device)[None, None] if causal else None  # (1, 1, Tq, Tk)
        if self.key_padding is not None:
            padding = self.key_padding[:, None, None, :]  # (B, 1, 1, Tk)
            allowed = padding if allowed is None else allowed & padding
        if self.segments is not None:  # packed examples: a query sees the keys of its own segment only
            same = self.segments[:, None, -q_len:, None] == self.segments[:, None, None, :]  # (B, 1, Tq, Tk)
            allowed = same if allowed is None else allowed & same
        mask = None if allowed is None else additive_mask(allowed, dtype)
        if self.position_bias is not None:
            bias = self.position_bias(self.query_positions, self.key_positions).to(dtype)  # (B, H, Tq, Tk)
            mask = bias if mask is None else mask + bias
        return mask, False

    def empty_rows(self, q_len: int, k_len: int) -> Tensor | None:
        """True where a query sees no key at all, (B, 1, Tq | 1, 1); None when no row can be empty."""
        if self.real_queries or self.key_padding is None:
            return None
        key = ("empty", q_len, k_len)
        if key not in self._derived:
            if self.causal:  # query i sees the keys up to its position k_len - q_len + i
                seen = self.key_padding.cumsum(-1)[:, k_len - q_len:]  # (B, Tq) real keys up to each query
                empty = (seen == 0)[:, None, :, None]
            else:
                empty = ~self.key_padding.any(-1)  # kept all-False in a compiled step rather than read (a sync)
                empty = empty[:, None, None, None] if torch.compiler.is_compiling() or bool(empty.any()) else None
            self._derived[key] = empty
        return self._derived[key]

    def shifted(self, start: int) -> AttentionMask:
        """The same mask for the keys from index ``start`` on (a rolling cache holds only its last keys); one
        object per start, shared by the layers of a pass."""
        if start == 0:
            return self
        key = ("shifted", start)
        if key not in self._derived:
            self._derived[key] = self._shifted(start)
        return self._derived[key]

    def _shifted(self, start: int) -> AttentionMask:
        return AttentionMask(
            self.causal,
            None if self.key_padding is None else self.key_padding[:, start:],
            self.query_positions,
            None if self.key_positions is None else self.key_positions[:, start:],
            self.position_bias,
            self.real_queries,
            None if self.segments is None else self.segments[:, start:],
        )


def zero_empty_rows(out: Tensor, weights: Tensor | None, mask: AttentionMask,
                    k_len: int) -> tuple[Tensor, Tensor | None]:
    """``out`` (B, H, Tq, Dh) and ``weights`` (B, H, Tq, Tk) with the rows of queries that see none of the
    ``k_len`` keys set to 0: what a kernel that sums over no key returns (the fused and reference kernels
    give such a row uniform weights over the masked keys instead)."""
    empty = mask.empty_rows(out.shape[2], k_len)
    if empty is None:
        return out, weights
    return out.masked_fill(empty, 0.0), None if weights is None else weights.masked_fill(empty, 0.0)


NO_MASK = AttentionMask()  # every query sees every key


def packed_segments(positions: Tensor) -> Tensor | None:
    """The segment of each token (B, T) when ``positions`` (B, T) restart inside a row (several examples packed
    into it, each counting from its own start), or None when every row counts on by one: Hugging Face's rule
    (``find_packed_sequence_indices``): a new segment wherever a position is not its predecessor's plus one."""
    step = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1)
    segments = (step != 1).cumsum(-1)
    return None if not bool(segments[:, -1].any()) else segments


@dataclass(eq=False)
class StepLayout:
    """Where the new tokens of one pass sit and which keys they see, as the pass's caller knows it.

    ``positions`` (B, T): each new token's position. ``key_positions`` (B, Tk): every key's (cached and
    new), for position biases; None: the new tokens are all the keys. ``key_padding`` (B, Tk) bool,
    True = a real token; None: nothing padded. ``real_queries``: every new token is real, none is padding (a
    decoding step after the prompt). ``keep``: the rows (of T) carried past the last block (a step that wants only
    the last token's logits); None: all. ``segments`` (B, Tk): packed examples (see ``AttentionMask``). A stack
    turns it into the mask its layers share (``attention_mask``); a paged layout (``nn.attention.paged``) gives
    the mask its pool reads.
    """

    positions: Tensor
    key_positions: Tensor | None = None
    key_padding: Tensor | None = None
    real_queries: bool = False
    keep: slice | Tensor | None = None
    segments: Tensor | None = None

    def attention_mask(self, causal: bool, position_bias: PositionBias | None) -> AttentionMask:
        keys = self.positions if self.key_positions is None else self.key_positions
        return AttentionMask(causal, self.key_padding, self.positions, keys, position_bias, self.real_queries,
                             self.segments)

    def encoder_mask(self, encoder_padding: Tensor | None) -> AttentionMask | None:
        """Cross-attention's mask over the encoder's output, ``encoder_padding`` (B, S) True = a real source token
        (None: every key is)."""
        return None if encoder_padding is None else AttentionMask(key_padding=encoder_padding)
