"""TransformerStack: positions, N TransformerBlocks and the final norm, causal or bidirectional,
with or without cross-attention to an encoder's hidden states. Every model runs one (or two)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.nn.attention import BlockBias, KVCache, MaskParts, RollingKVCache, additive_mask, build_mask, padding_mask
from tformer.nn.block import AttentionContext, LayerCache, TransformerBlock
from tformer.nn.inputs import check_attention_mask, check_positions
from tformer.nn.norm import build_norm
from tformer.nn.position import Positional, positional_from_config, positions_from_mask

# The kernels that take the mask as its parts (MaskParts) and never a dense (B, H, Tq, Tk) one.
STRUCTURED_KERNELS = ("chunked", "sliding_window", "performer")


@dataclass
class StackOutput:
    """``hidden`` (B, T, D) after the final norm; when asked for, per-layer self-attention weights
    (B, H, T, past + T), per-layer cross-attention weights (B, H, T, S), and hidden states
    (B, T, D): each block's input, then ``hidden`` (num_layers + 1 in all)."""

    hidden: Tensor
    attentions: list[Tensor] | None = None
    cross_attentions: list[Tensor] | None = None
    hidden_states: list[Tensor] | None = None


class TransformerStack(nn.Module):
    """The shared core after the front end: embedded inputs (B, T, D) -> hidden states (B, T, D).

    ``causal``: each position sees only itself and earlier ones (decoders); otherwise every
    position sees every unpadded one (encoders), and a relative-position bias is bidirectional.
    ``cross_attention``: each block also attends to ``encoder_hidden`` (encoder-decoders).
    ``add_positions=False``: the front end has added absolute positions already (a vision model's
    patch grid, which it can resample), so the stack adds none of ``config.positional``'s.
    """

    def __init__(self, config: ModelConfig, causal: bool, cross_attention: bool = False,
                 add_positions: bool = True) -> None:
        super().__init__()
        self.config = config
        self.causal = causal
        self.cross_attention = cross_attention
        self.structured = config.attention_kernel in STRUCTURED_KERNELS
        self.positional = positional_from_config(config, causal=causal, kind=None if add_positions else "none")

        def norm() -> nn.Module:
            return build_norm(config.norm, config.d_model, config.norm_eps, config.norm_bias)

        self.embedding_norm = norm() if config.embedding_norm else None  # BERT: after embeddings + positions
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(TransformerBlock(config, cross_attention) for _ in range(config.num_layers))
        # Post-norm blocks end in a norm already; pre-norm stacks need one before the head.
        self.final_norm = norm() if config.norm_position == "pre" else nn.Identity()

    @property
    def position_limit(self) -> int | None:
        """The number of positions when they index a fixed table (learned, sinusoidal), else None."""
        return self.positional.max_len if self.positional.has_table else None

    def new_cache(
        self, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device, source_len: int | None = None
    ) -> list[LayerCache]:
        """Empty key/value caches for ``max_len`` positions (a sliding window's: a rolling cache of its
        ``attention_window`` last positions, whatever ``max_len``); with cross-attention, also for the
        ``source_len`` encoder positions (filled by the first step, reused after), or, when
        ``source_len`` is None, slots left empty for the model's first step to make."""
        config = self.config

        def kv(length: int) -> KVCache:
            return KVCache(batch_size, config.num_kv_heads, length, config.head_dim, dtype, device)

        def own() -> KVCache:
            if config.attention_kernel == "sliding_window":
                return RollingKVCache(batch_size, config.num_kv_heads, config.attention_window, config.head_dim,
                                      dtype, device)
            return kv(max_len)

        cross = self.cross_attention and source_len is not None
        return [LayerCache(own(), kv(source_len) if cross else None) for _ in range(config.num_layers)]

    def forward(
        self,
        x: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: list[LayerCache] | None = None,
        encoder_hidden: Tensor | None = None,
        encoder_mask: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> StackOutput:
        """x: embedded inputs (B, T, D). ``attention_mask`` (B, past + T), 1 = attend, covers cached
        positions too; ``position_ids`` (B, T) default to counting attended tokens. ``encoder_hidden``
        (B, S, D) and ``encoder_mask`` (B, S), 1 = attend, feed cross-attention."""
        if encoder_hidden is not None and not self.cross_attention:
            raise ValueError("encoder_hidden given, but this stack has no cross-attention (cross_attention=False)")
        batch, length, _ = x.shape
        past = 0 if cache is None else cache[0].self_attention.length
        if attention_mask is not None:
            check_attention_mask(attention_mask, (batch, past + length))
        key_positions = _key_positions(batch, past + length, attention_mask, x.device)  # (B, past + T)
        if position_ids is None:
            position_ids = key_positions[:, past:]
        check_positions(position_ids, self.position_limit, self.positional.kind)

        absolute = self.positional.embeddings(position_ids)
        if absolute is not None:
            x = x + absolute
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        x = self.dropout(x)

        rotary = self.positional.rotary_angles(position_ids, x.dtype)
        if self.structured:
            if output_attentions and self.config.attention_kernel == "performer":
                raise ValueError("attention_kernel='performer' has no attention weights (output_attentions=True); "
                                 "use an exact kernel (sdpa, reference, chunked) to inspect them")
            context = AttentionContext(
                rotary=rotary, encoder_output=encoder_hidden, need_weights=output_attentions,
                parts=MaskParts(self.causal, None if attention_mask is None else attention_mask.bool(),
                                _block_bias(self.positional, position_ids, key_positions)),
                encoder_parts=MaskParts(key_padding_mask=None if encoder_mask is None else encoder_mask.bool()),
            )
        else:
            mask, is_causal = build_mask(
                length, past + length, causal=self.causal, attention_mask=attention_mask,
                position_bias=self.positional.attention_bias(position_ids, key_positions),
                dtype=x.dtype, device=x.device,
            )
            context = AttentionContext(
                mask=mask, is_causal=is_causal, rotary=rotary, encoder_output=encoder_hidden,
                encoder_mask=None if encoder_mask is None else additive_mask(padding_mask(encoder_mask), x.dtype),
                need_weights=output_attentions,
            )
        hidden_states: list[Tensor] = []
        attentions: list[Tensor] = []
        cross_attentions: list[Tensor] = []
        for index, block in enumerate(self.blocks):
            if output_hidden_states:
                hidden_states.append(x)
            x, self_weights, cross_weights = block(x, context, None if cache is None else cache[index])
            if output_attentions:
                attentions.append(self_weights)
                if cross_weights is not None:
                    cross_attentions.append(cross_weights)
        x = self.final_norm(x)
        if output_hidden_states:
            hidden_states.append(x)
        return StackOutput(
            hidden=x,
            attentions=attentions if output_attentions else None,
            cross_attentions=cross_attentions if output_attentions and cross_attentions else None,
            hidden_states=hidden_states if output_hidden_states else None,
        )


def _key_positions(batch: int, total: int, attention_mask: Tensor | None, device: torch.device) -> Tensor:
    """(B, past + T) position of every key: counted over attended tokens when padded."""
    if attention_mask is not None:
        return positions_from_mask(attention_mask)
    return torch.arange(total, device=device).expand(batch, total)


def _block_bias(positional: Positional, query_positions: Tensor, key_positions: Tensor) -> BlockBias | None:
    """The position bias (ALiBi, relative) of query rows and key columns, built block by block by the
    kernel from positions (B, Tq) and (B, Tk); None when the scheme adds none."""
    if not hasattr(positional, "bias"):
        return None

    def bias(query_index: Tensor, key_index: Tensor) -> Tensor:  # (B, H, tq, tk)
        return positional.bias(query_positions[:, query_index], key_positions[:, key_index])

    return bias
