"""TransformerBlock: self-attention, optional cross-attention and a feed-forward network,
each a residual branch, with the norm before (pre-norm) or after (post-norm) the residual add.
It is the only block forward: training, cached decoding and the serving engine all run it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.nn.attention import AttentionMask, MultiHeadAttention, Rotary
from tformer.nn.experts import build_feedforward
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


@dataclass
class LayerCache:
    """The cache backends of one block: self-attention's, and cross-attention's when it has one."""

    self_attention: Any
    cross_attention: Any = None


class TransformerBlock(nn.Module):
    """One layer of the shared core, configured by a ModelConfig.

    pre-norm:  x = x + drop(attn(norm(x)));            x = x + drop(ffn(norm(x)))
    post-norm: x = norm(x + drop(attn(x)));            x = norm(x + drop(ffn(x)))   (2017 paper)
    sandwich:  x = x + drop(norm'(attn(norm(x))));     x = x + drop(norm'(ffn(norm(x))))   (Gemma 2)

    ``layer``: its index in the stack, which picks its attention kernel (``config.layer_attention``: a sliding
    window on some layers, ``attention_kernel`` on the others). The scores are scaled by
    ``query_pre_attn_scalar``**-0.5 when set and capped by ``attention_softcap``.
    """

    def __init__(self, config: ModelConfig, cross_attention: bool = False, layer: int = 0) -> None:
        super().__init__()
        self.pre_norm = config.norm_position in ("pre", "sandwich")
        sandwich = config.norm_position == "sandwich"
        kernel, settings = config.layer_attention(layer)
        scale = None if config.query_pre_attn_scalar is None else config.query_pre_attn_scalar ** -0.5

        def norm() -> nn.Module:
            return build_norm(config.norm, config.d_model, config.norm_eps, config.norm_bias)

        def mha(cross: bool) -> MultiHeadAttention:
            return MultiHeadAttention(
                config.d_model, config.num_heads, config.num_kv_heads, config.head_dim, bias=config.attention_bias,
                dropout=config.attention_dropout, cross=cross, kernel=kernel, kernel_settings=settings,
                key_bias=config.key_bias, output_bias=config.output_bias, scale=scale, softcap=config.attention_softcap,
            )

        # the norms before each sublayer (pre, sandwich) or after its residual add (post); sandwich: also one on
        # each sublayer's output (``*_output_norm``)
        self.attention_norm = norm()
        self.attention = mha(cross=False)
        if sandwich:
            self.attention_output_norm = norm()
        self.cross_attention: MultiHeadAttention | None = None
        if cross_attention:
            self.cross_attention_norm = norm()
            self.cross_attention = mha(cross=True)
            if sandwich:
                self.cross_attention_output_norm = norm()
        self.feedforward_norm = norm()
        self.feedforward = build_feedforward(config)  # dense, or a mixture of experts (num_experts > 0)
        if sandwich:
            self.feedforward_output_norm = norm()
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
        norm = layers["attention_norm"]
        out, self_weights = layers["attention"](norm(x) if self.pre_norm else x, mask=context.mask,
                                                rotary=context.rotary, cache=self_cache,
                                                need_weights=context.need_weights, shape=context.shape)
        x = self._residual(x, out, norm, layers.get("attention_output_norm"))
        cross_weights = None
        cross_attention = layers.get("cross_attention")
        if cross_attention is not None:
            norm = layers["cross_attention_norm"]
            out, cross_weights = cross_attention(norm(x) if self.pre_norm else x, mask=context.encoder_mask,
                                                 context=context.encoder_output, cache=cross_cache,
                                                 need_weights=context.need_weights, shape=context.shape)
            x = self._residual(x, out, norm, layers.get("cross_attention_output_norm"))
        norm = layers["feedforward_norm"]
        out = layers["feedforward"](norm(x) if self.pre_norm else x)
        return self._residual(x, out, norm, layers.get("feedforward_output_norm")), self_weights, cross_weights

    def _residual(self, x: Tensor, out: Tensor, norm: nn.Module, output_norm: nn.Module | None = None) -> Tensor:
        """A sublayer's output ``out`` added to the stream ``x`` (after dropout in training): pre-norm adds it,
        sandwich adds it normalised by ``output_norm``, post-norm normalises the sum."""
        if output_norm is not None:
            out = output_norm(out)
        if self.training:
            out = self._modules["dropout"](out)
        return x + out if self.pre_norm else norm(x + out)
