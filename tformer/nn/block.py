"""TransformerBlock: self-attention, optional cross-attention and a feed-forward network,
each a residual branch, with the norm before (pre-norm) or after (post-norm) the residual add."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.nn.attention import KVCache, MaskParts, MultiHeadAttention, Rotary
from tformer.nn.feedforward import FeedForward
from tformer.nn.norm import build_norm


@dataclass
class AttentionContext:
    """What every layer of one forward pass shares: the mask, rotary angles and caches' inputs.

    ``mask``/``is_causal`` (and ``encoder_mask``) feed the kernels that take a dense additive mask
    (sdpa, reference); ``parts`` (and ``encoder_parts``) the mask as its parts for those that never
    form one (chunked, sliding_window, performer). A stack fills in only what its kernel reads.
    """

    mask: Tensor | None = None  # additive, broadcastable to (B, H, Tq, Tk)
    is_causal: bool = False
    rotary: Rotary | None = None
    encoder_output: Tensor | None = None  # (B, S, D) for cross-attention
    encoder_mask: Tensor | None = None  # additive, broadcastable to (B, H, Tq, S)
    need_weights: bool = False
    parts: MaskParts | None = None
    encoder_parts: MaskParts | None = None


@dataclass
class LayerCache:
    """The key/value caches of one block: self-attention, and cross-attention when it has one."""

    self_attention: KVCache
    cross_attention: KVCache | None = None


class TransformerBlock(nn.Module):
    """One layer of the shared core, configured by a ModelConfig.

    pre-norm:  x = x + drop(attn(norm(x)));            x = x + drop(ffn(norm(x)))
    post-norm: x = norm(x + drop(attn(x)));            x = norm(x + drop(ffn(x)))   (2017 paper)
    """

    def __init__(self, config: ModelConfig, cross_attention: bool = False) -> None:
        super().__init__()
        self.pre_norm = config.norm_position == "pre"

        def norm() -> nn.Module:
            return build_norm(config.norm, config.d_model, config.norm_eps, config.norm_bias)

        def mha(cross: bool) -> MultiHeadAttention:
            # A sliding window bands a sequence against itself; cross-attention sees all of its source.
            window = config.attention_kernel == "sliding_window" and not cross
            kernel = "chunked" if config.attention_kernel == "sliding_window" and cross else config.attention_kernel
            return MultiHeadAttention(
                config.d_model, config.num_heads, config.num_kv_heads, config.head_dim,
                bias=config.attention_bias, dropout=config.attention_dropout, cross=cross, kernel=kernel,
                window=config.attention_window if window else None, performer_features=config.performer_features,
                performer_redraw_interval=config.performer_redraw_interval,
            )

        self.attention_norm = norm()
        self.attention = mha(cross=False)
        self.cross_attention: MultiHeadAttention | None = None
        if cross_attention:
            self.cross_attention_norm = norm()
            self.cross_attention = mha(cross=True)
        self.feedforward_norm = norm()
        self.feedforward = FeedForward(config.d_model, config.d_ff, config.activation, config.feedforward_bias)
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()

    def forward(
        self, x: Tensor, context: AttentionContext, cache: LayerCache | None = None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x: (B, T, D) -> (B, T, D), and when the context asks for them the self-attention
        weights (B, H, T, past + T) and the cross-attention weights (B, H, T, S), else None."""
        weights: list[Tensor | None] = [None, None]  # self, cross

        def self_attention(h: Tensor) -> Tensor:
            out, weights[0] = self.attention(
                h, mask=context.mask, is_causal=context.is_causal, rotary=context.rotary,
                cache=None if cache is None else cache.self_attention, need_weights=context.need_weights,
                parts=context.parts,
            )
            return out

        def cross_attention(h: Tensor) -> Tensor:
            out, weights[1] = self.cross_attention(
                h, context=context.encoder_output, mask=context.encoder_mask,
                cache=None if cache is None else cache.cross_attention, need_weights=context.need_weights,
                parts=context.encoder_parts,
            )
            return out

        x = self._residual(x, self.attention_norm, self_attention)
        if self.cross_attention is not None:
            x = self._residual(x, self.cross_attention_norm, cross_attention)
        x = self._residual(x, self.feedforward_norm, self.feedforward)
        return x, weights[0], weights[1]

    def _residual(self, x: Tensor, norm: nn.Module, sublayer) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))
