"""A model's decoding state across steps: key/value cache, each row's positions and padding.

Decoding strategies (greedy, sampling, beam search, speculative) talk only to a session:
``extend`` runs new tokens and returns their logits, ``truncate`` forgets the last tokens
(rejected drafts), ``reorder`` picks and repeats rows (beams). A decoder-only model gets a
``DecoderSession``; an encoder–decoder model will get a session that runs its encoder once
and then steps the decoder the same way.

Positions and masks are computed once per session, not per step: the whole row layout
``(B, max_len)`` is known up front (the prompt's padding, then real tokens only), so a step
slices its positions from a table and, when nothing is padded, needs no mask at all.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tformer.generation.fast_decoder import FastDecoder, fast_decoder_for
from tformer.nn.attention import additive_mask, causal_mask
from tformer.nn.position import positions_from_mask


def cache_bytes_per_token(model: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Bytes of key/value cache one token of one sequence takes: 2 x layers x KV heads x head size.

    Grouped- and multi-query models cache only their key/value heads, so they need
    ``num_heads / num_kv_heads`` times less than multi-head attention of the same width.
    """
    config = model.config
    dtype = dtype or next(model.parameters()).dtype
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * element


class DecoderSession:
    """Decoding state of a DecoderLM for ``batch_size`` rows of up to ``max_len`` tokens each.

    ``attention_mask`` (B, T) marks the real tokens of left-padded prompts (None: no padding).
    With ``use_cache=False`` every step re-runs the whole sequence (the slow reference);
    ``fast=False`` steps through the model's own forward instead of the lean ``FastDecoder``.
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
    ) -> None:
        self.model = model
        self.batch_size = batch_size
        self.max_len = max_len
        self.length = 0
        device = model.lm_head.weight.device
        self.dtype = model.lm_head.weight.dtype
        self.fast: FastDecoder | None = fast_decoder_for(model) if fast and use_cache else None
        if self.fast is not None:
            self.fast.reserve_positions(max_len)
        self.cache = model.new_cache(batch_size, max_len) if use_cache else None
        self.tokens = None if use_cache else torch.zeros(batch_size, max_len, dtype=torch.long, device=device)

        # The row layout: which columns are real tokens (prompt padding is not), and positions.
        self.padded = attention_mask is not None and not bool(attention_mask.bool().all())
        attend = torch.ones(batch_size, max_len, dtype=torch.bool, device=device)
        if self.padded:
            attend[:, : attention_mask.shape[1]] = attention_mask.bool()
        self.attend = attend  # (B, max_len) True = a real token
        self.positions = positions_from_mask(attend)  # (B, max_len) true position of each column
        self.bias = getattr(model.stack.positional, "bias", None)  # ALiBi / relative: an additive bias module
        # Additive padding mask for one-token steps (B, 1, 1, max_len); None when nothing is padded.
        self.padding_mask = additive_mask(attend, self.dtype)[:, None, None, :] if self.padded else None

    # ---- steps -----------------------------------------------------------------------------------

    def extend(self, input_ids: Tensor, last_only: bool = False) -> Tensor:
        """Run ``input_ids`` (B, T) after what the session holds; logits (B, T, V), or (B, 1, V)."""
        past, length = self.length, input_ids.shape[1]
        end = past + length
        if end > self.max_len:
            raise ValueError(f"decoding session overflow: {end} tokens exceed its length {self.max_len}")
        if self.fast is not None:
            positions = self.positions[:, past:end]
            logits = self.fast.forward(input_ids, positions, self._caches(), self._mask(past, end), last_only)
        elif self.cache is not None:
            logits = self.model(input_ids, attention_mask=self._model_mask(end), cache=self.cache).logits
        else:
            self.tokens[:, past:end] = input_ids
            logits = self.model(self.tokens[:, :end], attention_mask=self._model_mask(end)).logits[:, past:]
        self.length = end
        return logits[:, -1:] if last_only else logits

    def truncate(self, length: int) -> None:
        """Forget every token after the first ``length`` (speculative decoding's rejected drafts)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a session of {self.length} tokens to {length}")
        self.length = length
        for cache in self._caches():
            cache.length = length

    def reorder(self, rows: Tensor) -> None:
        """Keep the rows named by ``rows`` (B',), in that order, repeating as asked (beam search)."""
        self.batch_size = rows.shape[0]
        for cache in self._caches():
            filled = slice(0, cache.length)
            if cache.keys.shape[0] == rows.shape[0]:
                cache.keys[:, :, filled] = cache.keys[:, :, filled].index_select(0, rows)
                cache.values[:, :, filled] = cache.values[:, :, filled].index_select(0, rows)
            else:
                cache.keys = cache.keys.index_select(0, rows)
                cache.values = cache.values.index_select(0, rows)
        self.attend = self.attend.index_select(0, rows)
        self.positions = self.positions.index_select(0, rows)
        if self.padding_mask is not None:
            self.padding_mask = self.padding_mask.index_select(0, rows)
        if self.tokens is not None:
            self.tokens = self.tokens.index_select(0, rows)

    # ---- masks -----------------------------------------------------------------------------------

    def _caches(self):
        return [] if self.cache is None else [layer.self_attention for layer in self.cache]

    def _mask(self, past: int, end: int) -> Tensor | None:
        """The additive mask (B|1, 1|H, T, end) of the fast path, or None when none is needed."""
        length = end - past
        if length == 1:
            mask = None if self.padding_mask is None else self.padding_mask[:, :, :, :end]
        else:
            allowed = causal_mask(length, end, self.attend.device)[None, None]  # (1, 1, T, end)
            if self.padded:
                allowed = allowed & self.attend[:, None, None, :end]
            mask = additive_mask(allowed, self.dtype)
        if self.bias is not None:
            bias = self.bias(self.positions[:, past:end], self.positions[:, :end]).to(self.dtype)
            mask = bias if mask is None else mask + bias
        return mask

    def _model_mask(self, end: int) -> Tensor | None:
        """The ``attention_mask`` (B, end) the model's own forward wants, or None without padding."""
        return self.attend[:, :end].long() if self.padded else None
