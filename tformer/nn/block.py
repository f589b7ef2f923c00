"""TransformerBlock: self-attention, optional cross-attention and a feed-forward network,
each a residual branch, with the norm before (pre-norm) or after (post-norm) the residual add.
It is the only block forward: training, cached decoding and the serving engine all run it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.nn.attention import AttentionMask, MultiHeadAttention, Rotary, kernel_class
from tformer.nn.feedforward import FeedForward
from tformer.nn.norm import build_norm


@dataclass
class AttentionContext:
    """What every layer of one pass shares, built once by the stack: the self-attention mask, rotary
    angles, and for cross-attention the encoder's output (B, S, D) and its mask."""

    mask: AttentionMask | None = None  # None: every query sees every key
    rotary: Rotary | None = None
    encoder_output: Tensor | None = None
    encoder_mask: AttentionMask | None = None
    need_weights: bool = False
    shape: tuple[int, int] | None = None  # (B, T) when the blocks get their inputs as rows (B * T, D)
    direct: bool = False  # call the parts' forwards directly: nothing observes the modules (nn/lean.py)


@dataclass
class LayerCache:
    """The cache backends of one block: self-attention's, and cross-attention's when it has one."""

    self_attention: Any
    cross_attention: Any = None


class TransformerBlock(nn.Module):
    """One layer of the shared core, configured by a ModelConfig.

    pre-norm:  x = x + drop(attn(norm(x)));            x = x + drop(ffn(norm(x)))
    post-norm: x = norm(x + drop(attn(x)));            x = norm(x + drop(ffn(x)))   (2017 paper)
    """

    def __init__(self, config: ModelConfig, cross_attention: bool = False) -> None:
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        kernel = kernel_class(config.attention_kernel)
        settings = {name: getattr(config, name) for name in kernel.fields}

        def norm() -> nn.Module:
            return build_norm(config.norm, config.d_model, config.norm_eps, config.norm_bias)

        def mha(cross: bool) -> MultiHeadAttention:
            return MultiHeadAttention(
                config.d_model, config.num_heads, config.num_kv_heads, config.head_dim, bias=config.attention_bias,
                dropout=config.attention_dropout, cross=cross, kernel=config.attention_kernel, kernel_settings=settings,
                key_bias=config.key_bias, output_bias=config.output_bias,
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
        """x: (B, T, D), or its rows (B * T, D) with ``context.shape`` = (B, T) -> the same layout, and when
        the context asks for them the self-attention weights (B, H, T, past + T) and the cross-attention
        weights (B, H, T, S), else None. Every part but attention reads rows alone."""
        layers = self._modules  # read directly: a decoding step runs every block once per token
        self_cache = cross_cache = None
        if cache is not None:
            self_cache, cross_cache = cache.self_attention, cache.cross_attention
        if context.direct:  # a decoding step's self-attention, written out (see _attend)
            norm, attention = layers["attention_norm"], layers["attention"]
            out, self_weights = attention.forward(norm.forward(x) if self.pre_norm else x, mask=context.mask,
                                                  rotary=context.rotary, cache=self_cache, shape=context.shape,
                                                  direct=True)
            x = x + out if self.pre_norm else norm.forward(x + out)
        else:
            x, self_weights = self._attend(x, layers["attention_norm"], layers["attention"], context.mask, None,
                                           context.rotary, self_cache, context)
        cross_weights = None
        cross_attention = layers.get("cross_attention")
        if cross_attention is not None:
            x, cross_weights = self._attend(x, layers["cross_attention_norm"], cross_attention, context.encoder_mask,
                                            context.encoder_output, None, cross_cache, context)
        norm, feedforward = layers["feedforward_norm"], layers["feedforward"]
        if context.direct:
            out = feedforward.forward(norm.forward(x) if self.pre_norm else x, direct=True)
            return (x + out if self.pre_norm else norm.forward(x + out)), self_weights, cross_weights
        out = feedforward(norm(x) if self.pre_norm else x)
        if self.training:
            out = self.dropout(out)
        return (x + out if self.pre_norm else norm(x + out)), self_weights, cross_weights

    def _attend(self, x: Tensor, norm: nn.Module, attention: MultiHeadAttention, mask: AttentionMask | None,
                source: Tensor | None, rotary: Rotary | None, cache: Any,
                context: AttentionContext) -> tuple[Tensor, Tensor | None]:
        """One attention sublayer as a residual branch (self-attention, or cross-attention to ``source``)."""
        if context.direct:  # a decoding step: no dropout, no hooks
            out, weights = attention.forward(norm.forward(x) if self.pre_norm else x, mask=mask, context=source,
                                             rotary=rotary, cache=cache, need_weights=context.need_weights,
                                             shape=context.shape, direct=True)
            return (x + out if self.pre_norm else norm.forward(x + out)), weights
        out, weights = attention(norm(x) if self.pre_norm else x, mask=mask, context=source, rotary=rotary,
                                 cache=cache, need_weights=context.need_weights, shape=context.shape)
        if self.training:
            out = self.dropout(out)
        return (x + out if self.pre_norm else norm(x + out)), weights
