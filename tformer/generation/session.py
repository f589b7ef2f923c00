"""The Session protocol: the only thing decoding strategies talk to, and the hooks a model
offers so that a session can be opened on it.

Strategies (greedy, sampling, beam search, speculative, streaming) call four things:
``extend`` runs new tokens after what the session holds and returns their logits,
``truncate`` forgets the last tokens (rejected drafts), ``reorder`` picks and repeats rows
(beams), and ``length`` says how many tokens it holds. They never read a model's attributes.

A model family joins generation by offering these hooks (``DecoderLM`` has them; an
encoder–decoder implements the same four and nothing else):

- ``config``: its ``ModelConfig`` (``vocab_size``, default ``eos_token_id`` / ``pad_token_id``).
- ``prepare_generation(input_ids, attention_mask) -> GenerationState``: called once per
  ``generate`` call. A decoder continues its prompt as it is; an encoder–decoder encodes the
  source once and returns its decoder's start tokens plus the encoder state every step needs.
- ``new_cache(batch_size, max_len) -> list[LayerCache]``: one per block, for up to ``max_len``
  decoder positions. The ``cross_attention`` slot may stay None: the model's forward fills it
  on its first step (the projected encoder output, computed once).
- ``forward(input_ids, attention_mask=..., cache=..., **state.step_inputs)``: one step, with
  ``input_ids`` (B, T) after the cached tokens and ``attention_mask`` (B, cached + T) or None
  when nothing is padded; returns an object with ``logits`` (B, T, V).
- ``position_limit``: the most decoder positions it can take (a position table), or None.
- ``encodes_prompt`` (optional, default False): the prompt is a source the model encodes, so
  its padding may be on either side (a decoder's prompt must be left-padded).
- ``cache_bytes_per_token()`` (optional): what its cache holds per token and sequence, for a model whose
  cache is not one key/value pair per block (a recurrent state: 0); ``new_cache`` may then return any
  object with ``reorder(rows)`` (beam search), and the session refuses to truncate it.

``ModelSession`` runs any model through these hooks; reordering moves every row-indexed piece
of state together: the self-attention caches, the cross-attention caches and the step inputs
(encoder output, encoder mask). ``DecoderSession`` adds the decoder's fast path: positions and
masks laid out once per session (the whole row layout ``(B, max_len)`` is known up front: the
prompt's padding, then real tokens only), and the lean ``FastDecoder`` forward when it covers
the model.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from tformer.generation.fast_decoder import FastDecoder, fast_decoder_for
from tformer.generation.settings import GenerationError
from tformer.models.output import GenerationState
from tformer.nn.attention import KVCache, additive_mask, causal_mask
from tformer.nn.position import positions_from_mask


class Session(Protocol):
    """What a decoding strategy may ask of a model's decoding state."""

    length: int  # tokens held per row

    def extend(self, input_ids: Tensor, last_only: bool = False) -> Tensor:
        """Run ``input_ids`` (B, T) after what the session holds; logits (B, T, V), or (B, 1, V)."""

    def truncate(self, length: int) -> None:
        """Forget every token after the first ``length``."""

    def reorder(self, rows: Tensor, same_source: bool = False) -> None:
        """Keep the rows named by ``rows`` (B',), in that order, repeating as asked. ``same_source``:
        every row is taken from a row with the same source (beams of one sentence), so what is held
        per source (an encoder's output and cross-attention keys) may stay as it is."""


GROWTH_CHUNK = 1024  # new tokens a growing session holds room for at first


def open_session(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, max_new_tokens: int, *,
    use_cache: bool = True, role: str = "model", grow: bool = False,
) -> tuple[ModelSession, GenerationState]:
    """Prepare the prompt (``prepare_generation``) and open a session for it and ``max_new_tokens`` more.

    A model whose steps need nothing but tokens gets a ``DecoderSession`` (the fast path when
    it covers the model); any other model a ``ModelSession``. With ``grow`` (a run that may end
    early) the session first holds room for ``GROWTH_CHUNK`` new tokens and doubles as needed."""
    state = model.prepare_generation(input_ids, attention_mask)
    batch, prompt_length = state.input_ids.shape
    limit = model.position_limit
    if limit is not None and prompt_length + max_new_tokens > limit:
        raise GenerationError(
            f"prompt ({prompt_length} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
            f"max_seq_len={limit} of this {role}'s {model.config.positional} position table"
        )
    max_len = prompt_length + max_new_tokens
    capacity = min(max_len, prompt_length + GROWTH_CHUNK) if grow else max_len
    if state.step_inputs:
        session = ModelSession(model, batch, max_len, state.attention_mask, step_inputs=state.step_inputs,
                               use_cache=use_cache, capacity=capacity)
    else:
        session = DecoderSession(model, batch, max_len, state.attention_mask, use_cache=use_cache, capacity=capacity)
    return session, state


def cache_bytes_per_token(model: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Bytes of key/value cache one token of one sequence takes: 2 x layers x KV heads x head size.

    Grouped- and multi-query models cache only their key/value heads, so they need
    ``num_heads / num_kv_heads`` times less than multi-head attention of the same width.
    """
    own = getattr(model, "cache_bytes_per_token", None)
    if own is not None:  # a model whose state is not a key/value cache (a recurrent one) says what it holds
        return own()
    config = model.config
    dtype = dtype or next(model.parameters()).dtype
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * element


def session_bytes(model: nn.Module, rows: int, length: int, use_cache: bool = True) -> int:
    """About how many bytes a session of ``rows`` sequences of ``length`` tokens holds: the
    key/value cache (without one, the token buffer) and the row layout (which columns are
    tokens, their positions, the padding mask, the rotary table)."""
    config = model.config
    element = next(model.parameters()).element_size()
    per_token = cache_bytes_per_token(model) if use_cache else 8
    layout = rows * (1 + 8 + element)  # attend (bool), positions (int64), additive padding mask
    rotary = 3 * config.head_dim * 4 if config.positional == "rope" else 0  # cos, sin and their angles
    return length * (rows * per_token + layout + rotary)


class ModelSession:
    """Decoding state of any model with the generation hooks: ``batch_size`` rows of up to
    ``max_len`` decoder tokens each, stepped through the model's own forward.

    ``attention_mask`` (B, T) marks the real tokens of left-padded prompts (None: no padding);
    ``step_inputs`` go to every forward step (see ``GenerationState``). With ``use_cache=False``
    every step re-runs the whole decoder sequence (the slow reference). ``capacity`` (default
    ``max_len``) is the room held at first; a step beyond it doubles it, up to ``max_len``.
    """

    def __init__(
        self,
        model: nn.Module,
        batch_size: int,
        max_len: int,
        attention_mask: Tensor | None = None,
        *,
        step_inputs: dict[str, Tensor] | None = None,
        use_cache: bool = True,
        capacity: int | None = None,
    ) -> None:
        self.model = model
        self.batch_size = batch_size
        self.max_len = max_len
        self.capacity = max_len if capacity is None else min(capacity, max_len)
        self.length = 0
        self.step_inputs = dict(step_inputs or {})
        device = next(model.parameters()).device
        self.cache = model.new_cache(batch_size, self.capacity) if use_cache else None
        self.tokens = None if use_cache else torch.zeros(batch_size, self.capacity, dtype=torch.long, device=device)
        # The row layout: which columns are real tokens (the prompt's padding is not).
        self.padded = attention_mask is not None and not bool(attention_mask.bool().all())
        attend = torch.ones(batch_size, self.capacity, dtype=torch.bool, device=device)
        if self.padded:
            attend[:, : attention_mask.shape[1]] = attention_mask.bool()
        self.attend = attend  # (B, capacity) True = a real token

    # ---- the protocol ------------------------------------------------------------------------------

    def extend(self, input_ids: Tensor, last_only: bool = False) -> Tensor:
        """Run ``input_ids`` (B, T) after what the session holds; logits (B, T, V), or (B, 1, V)."""
        past, end = self.length, self.length + input_ids.shape[1]
        if end > self.capacity:
            self._grow(end)
        logits = self._step(input_ids, past, end, last_only)
        self.length = end
        return logits[:, -1:] if last_only else logits

    def truncate(self, length: int) -> None:
        """Forget every token after the first ``length`` (speculative decoding's rejected drafts)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a session of {self.length} tokens to {length}")
        if self.cache is not None and not isinstance(self.cache, list):
            raise GenerationError("a recurrent model's state cannot forget tokens (speculative decoding needs a "
                                  "key/value cache)")
        self.length = length
        for cache in self._caches():
            cache.length = length

    def reorder(self, rows: Tensor, same_source: bool = False) -> None:
        """Keep the rows named by ``rows`` (B',), in that order, repeating as asked (beam search):
        self- and cross-attention caches, step inputs and the row layout alike; with ``same_source``
        and the batch keeping its size, the cross-attention caches and step inputs (the same for
        every row of a source) are left as they are."""
        keeps_sources = same_source and rows.shape[0] == self.batch_size
        self.batch_size = rows.shape[0]
        for cache in self._caches():
            _reorder_filled(cache, rows)
        if self.cache is not None and not isinstance(self.cache, list):
            self.cache.reorder(rows)  # a model's own state (a recurrent one)
        if not keeps_sources:
            for layer in self._layers():
                if layer.cross_attention is not None:
                    layer.cross_attention.reorder(rows)
            self.step_inputs = {name: value.index_select(0, rows) for name, value in self.step_inputs.items()}
        self.attend = self.attend.index_select(0, rows)
        if self.tokens is not None:
            self.tokens = self.tokens.index_select(0, rows)

    def _grow(self, end: int) -> None:
        """Room for at least ``end`` tokens: the capacity doubles (at most ``max_len``); what is held is kept."""
        if end > self.max_len:
            raise ValueError(f"decoding session overflow: {end} tokens exceed its length {self.max_len}")
        capacity = min(self.max_len, max(end, 2 * self.capacity))
        for cache in self._caches():
            cache.grow(capacity)
        added = capacity - self.capacity
        if self.tokens is not None:
            self.tokens = torch.cat([self.tokens, self.tokens.new_zeros(self.tokens.shape[0], added)], dim=1)
        self.attend = torch.cat([self.attend, self.attend.new_ones(self.attend.shape[0], added)], dim=1)
        self.capacity = capacity

    # ---- steps ---------------------------------------------------------------------------------------

    def _step(self, input_ids: Tensor, past: int, end: int, last_only: bool) -> Tensor:
        """Logits of ``input_ids`` (B, T) at columns past .. end through the model's own forward."""
        mask = self.attend[:, :end].long() if self.padded else None  # (B, end), or None without padding
        if self.cache is not None:
            return self.model(input_ids, attention_mask=mask, cache=self.cache, **self.step_inputs).logits
        self.tokens[:, past:end] = input_ids
        return self.model(self.tokens[:, :end], attention_mask=mask, **self.step_inputs).logits[:, past:]

    def _layers(self) -> list:
        """The per-block caches (LayerCache), or none: no cache, or a model's own state (a recurrent one)."""
        return self.cache if isinstance(self.cache, list) else []

    def _caches(self) -> list[KVCache]:
        """The self-attention caches, one per block."""
        return [layer.self_attention for layer in self._layers()]


class DecoderSession(ModelSession):
    """A decoder-only model's session: the lean ``FastDecoder`` forward when it covers the model
    (``fast=False`` or no cache: the model's own forward), with positions and masks laid out once.

    A step slices its positions from the session's table and, when nothing is padded and
    there is no position bias, a one-token step needs no mask at all.
    """

    def __init__(
        self,
        model: nn.Module,
        batch_size: int,
        max_len: int,
        attention_mask: Tensor | None = None,
        *,
        use_cache: bool = True,
        fast: bool = True,
        capacity: int | None = None,
    ) -> None:
        super().__init__(model, batch_size, max_len, attention_mask, use_cache=use_cache, capacity=capacity)
        self.fast: FastDecoder | None = fast_decoder_for(model) if fast and use_cache else None
        self.positions = self.padding_mask = self.bias = None
        if self.fast is not None:
            self.bias = getattr(self.fast.positional, "bias", None)  # ALiBi / relative: an additive bias module
            self._lay_out()

    def _lay_out(self) -> None:
        """The fast path's per-column tables for the session's capacity, from the row layout."""
        self.fast.reserve_positions(self.capacity)
        self.positions = positions_from_mask(self.attend)  # (B, capacity) true position of each column
        # Additive padding mask for one-token steps (B, 1, 1, capacity); None when nothing is padded.
        self.padding_mask = additive_mask(self.attend, self.fast.dtype)[:, None, None, :] if self.padded else None

    def _grow(self, end: int) -> None:
        super()._grow(end)
        if self.fast is not None:
            self._lay_out()

    def reorder(self, rows: Tensor, same_source: bool = False) -> None:
        super().reorder(rows, same_source)
        if self.positions is not None:
            self.positions = self.positions.index_select(0, rows)
        if self.padding_mask is not None:
            self.padding_mask = self.padding_mask.index_select(0, rows)

    def _step(self, input_ids: Tensor, past: int, end: int, last_only: bool) -> Tensor:
        if self.fast is None:
            return super()._step(input_ids, past, end, last_only)
        positions = self.positions[:, past:end]
        return self.fast.forward(input_ids, positions, self._caches(), self._mask(past, end), last_only)

    def _mask(self, past: int, end: int) -> Tensor | None:
        """The additive mask (B|1, 1|H, T, end) of the fast path, or None when none is needed."""
        length = end - past
        if length == 1:
            mask = None if self.padding_mask is None else self.padding_mask[:, :, :, :end]
        else:
            allowed = causal_mask(length, end, self.attend.device)[None, None]  # (1, 1, T, end)
            if self.padded:
                allowed = allowed & self.attend[:, None, None, :end]
            mask = additive_mask(allowed, self.fast.dtype)
        if self.bias is not None:
            bias = self.bias(self.positions[:, past:end], self.positions[:, :end]).to(self.fast.dtype)
            mask = bias if mask is None else mask + bias
        return mask


def _reorder_filled(cache: KVCache, rows: Tensor) -> None:
    """Reorder a self-attention cache's rows; in place over its filled part when the batch keeps its size."""
    if cache.keys.shape[0] != rows.shape[0]:
        cache.reorder(rows)
        return
    filled = slice(0, cache.length)
    cache.keys[:, :, filled] = cache.keys[:, :, filled].index_select(0, rows)
    cache.values[:, :, filled] = cache.values[:, :, filled].index_select(0, rows)
