"""A decoding step over many sequences at once, each at its own length, with keys and values in a
``BlockPool`` read through every sequence's block table (PagedAttention).

One step mixes sequences that decode one token with sequences whose whole prompt is prefilled:
every new token of every sequence is one row of an (N, D) activation, so the projections and
feed-forward layers are single matrix products over all of them; only attention is grouped: the
one-token sequences attend together (their keys gathered into one padded batch), each prefill
attends alone (causal over its prompt). Logits come back for each sequence's last new token.

The weights are ``FastDecoder``'s layout, and the configurations it covers are covered here, less
the position schemes that add a bias to the scores (ALiBi, relative): those are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.generation.fast_decoder import FastDecoder, FastDecoderUnsupported, _Layer
from tformer.nn.position import apply_rotary
from tformer.serving.paged_cache import BlockPool, BlockTable

PAGED_POSITIONALS = ("learned", "sinusoidal", "rope", "none")


@dataclass
class _Prefill:
    rows: slice  # its new tokens' rows in the step
    context: Tensor  # (L,) slots of all its tokens
    mask: Tensor | None  # (T, L) additive, or None when the prompt is the whole context (plain causal)


@dataclass
class PagedStep:
    """The layout of one step: every sequence's new tokens as rows, and where attention reads."""

    input_ids: Tensor  # (N,) the new tokens, sequence after sequence
    positions: Tensor  # (N,)
    slots: Tensor  # (N,) pool rows their keys and values go to
    last_rows: Tensor  # (S,) each sequence's last new row: its logits are returned
    decode_rows: Tensor  # (Bd,) rows of the sequences adding one token
    decode_context: Tensor | None  # (Bd, Lmax) their slots, padded with slot 0
    decode_mask: Tensor | None  # (Bd, 1, 1, Lmax) additive, None when every context is Lmax long
    prefills: list[_Prefill]

    @classmethod
    def build(cls, tables: list[BlockTable], new_tokens: list[list[int]], dtype: torch.dtype) -> PagedStep:
        """The step for sequences whose ``tables`` already hold room for their ``new_tokens``."""
        ids, positions, slots, last_rows, decode_rows, decode_contexts, prefills = [], [], [], [], [], [], []
        row = 0
        for table, tokens in zip(tables, new_tokens, strict=True):
            count = len(tokens)
            context = table.slots(0, table.length)  # (L,)
            ids.extend(tokens)
            positions.append(torch.arange(table.length - count, table.length))
            slots.append(context[-count:])
            if count == 1:
                decode_rows.append(row)
                decode_contexts.append(context)
            else:
                prefills.append(_Prefill(slice(row, row + count), context, _offset_causal_mask(count, len(context),
                                                                                              dtype)))
            row += count
            last_rows.append(row - 1)
        context, mask = _pad_contexts(decode_contexts, dtype)
        return cls(torch.tensor(ids, dtype=torch.long), torch.cat(positions), torch.cat(slots),
                   torch.tensor(last_rows), torch.tensor(decode_rows, dtype=torch.long), context, mask, prefills)


def _offset_causal_mask(queries: int, keys: int, dtype: torch.dtype) -> Tensor | None:
    """Queries at the last ``queries`` of ``keys`` positions see up to their own; None when they are all."""
    if queries == keys:
        return None
    allowed = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    return torch.zeros(queries, keys, dtype=dtype).masked_fill(~allowed, float("-inf"))


def _pad_contexts(contexts: list[Tensor], dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
    """Slots of the one-token sequences as (Bd, Lmax) and the additive mask hiding the padding."""
    if not contexts:
        return None, None
    longest = max(len(context) for context in contexts)
    padded = torch.zeros(len(contexts), longest, dtype=torch.long)
    for index, context in enumerate(contexts):
        padded[index, : len(context)] = context
    if all(len(context) == longest for context in contexts):
        return padded, None
    lengths = torch.tensor([len(context) for context in contexts])
    hidden = torch.arange(longest)[None, :] >= lengths[:, None]  # (Bd, Lmax)
    mask = torch.zeros(hidden.shape, dtype=dtype).masked_fill(hidden, float("-inf"))
    return padded, mask[:, None, None, :]


class PagedDecoder(FastDecoder):
    """``FastDecoder``'s weights with a forward over a ``BlockPool``: many sequences, one step."""

    @staticmethod
    def supports(model: nn.Module) -> str | None:
        reason = FastDecoder.supports(model)
        if reason is None and model.stack.positional.kind not in PAGED_POSITIONALS:
            reason = (f"positional={model.stack.positional.kind!r} (paged attention covers "
                      f"{', '.join(PAGED_POSITIONALS)})")
        return reason

    def __init__(self, model: nn.Module) -> None:
        reason = self.supports(model)
        if reason is not None:
            raise FastDecoderUnsupported(reason)
        super().__init__(model)

    def new_pool(self, num_blocks: int, block_size: int) -> BlockPool:
        return BlockPool(num_blocks, block_size, len(self.layers), self.num_kv_heads, self.head_dim, self.dtype,
                         self.device)

    def step(self, step: PagedStep, pool: BlockPool) -> Tensor:
        """Run ``step``, storing its keys and values in ``pool``; logits (S, V) of each sequence's last token."""
        rotary = None
        if self.inverse_frequencies is not None:
            self.reserve_positions(int(step.positions.max()) + 1)
            rotary = self._rotary_cos[step.positions][:, None], self._rotary_sin[step.positions][:, None]  # (N,1,Dh)
        x = F.embedding(step.input_ids, self.token_embedding)  # (N, D)
        if self.embedding_scale is not None:
            x = x * self.embedding_scale
        if self.position_table is not None:
            x = x + F.embedding(step.positions, self.position_table)
        for index, layer in enumerate(self.layers):
            x = self._paged_block(layer, x, step, pool.keys[index], pool.values[index], rotary)
        x = x[step.last_rows]
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.lm_head(x)  # (S, V)

    def _paged_block(self, layer: _Layer, x: Tensor, step: PagedStep, keys: Tensor, values: Tensor,
                     rotary: tuple[Tensor, Tensor] | None) -> Tensor:
        if self.pre_norm:
            x = x + self._paged_attention(layer, layer.attention_norm(x), step, keys, values, rotary)
            return x + self._feedforward(layer, layer.feedforward_norm(x))
        x = layer.attention_norm(x + self._paged_attention(layer, x, step, keys, values, rotary))
        return layer.feedforward_norm(x + self._feedforward(layer, x))

    def _paged_attention(self, layer: _Layer, h: Tensor, step: PagedStep, keys: Tensor, values: Tensor,
                         rotary: tuple[Tensor, Tensor] | None) -> Tensor:
        """h (N, D) -> (N, D); ``keys``/``values`` are one layer's pool (slots, Hkv, Dh)."""
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        rows = h.shape[0]
        q, k, v = layer.qkv(h).split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q, k, v = q.view(rows, heads, head_dim), k.view(rows, kv_heads, head_dim), v.view(rows, kv_heads, head_dim)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        keys.index_copy_(0, step.slots, k)
        values.index_copy_(0, step.slots, v)
        out = q.new_empty(rows, heads, head_dim)
        grouped = kv_heads != heads
        if step.decode_context is not None:
            batch, longest = step.decode_context.shape
            flat = step.decode_context.view(-1)  # index_select gathers rows faster than indexing by a 2-D tensor
            context_keys = keys.index_select(0, flat).view(batch, longest, kv_heads, head_dim).transpose(1, 2)
            context_values = values.index_select(0, flat).view(batch, longest, kv_heads, head_dim).transpose(1, 2)
            queries = q[step.decode_rows].unsqueeze(2)  # (Bd, H, 1, Dh)
            attended = F.scaled_dot_product_attention(queries, context_keys, context_values,
                                                      attn_mask=step.decode_mask, enable_gqa=grouped)
            out[step.decode_rows] = attended.squeeze(2)
        for prefill in step.prefills:
            queries = q[prefill.rows].transpose(0, 1).unsqueeze(0)  # (1, H, T, Dh)
            context_keys = keys.index_select(0, prefill.context).transpose(0, 1).unsqueeze(0)  # (1, Hkv, L, Dh)
            context_values = values.index_select(0, prefill.context).transpose(0, 1).unsqueeze(0)
            attended = F.scaled_dot_product_attention(queries, context_keys, context_values, attn_mask=prefill.mask,
                                                      is_causal=prefill.mask is None, enable_gqa=grouped)
            out[prefill.rows] = attended[0].transpose(0, 1)
        return layer.attention_out(out.view(rows, heads * head_dim))

