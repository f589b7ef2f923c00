"""The lean decoding forward of a DecoderLM: the same function as ``DecoderLM.forward`` with a
cache, written as a flat sequence of tensor operations for the few tokens of a decoding step.

Why a second forward: a one-token step of a small model is dominated by per-operation
overhead (module calls, mask building, input validation), and on CPU by how the weights are
read. This path skips the module machinery, takes its mask and positions ready-made from the
decoding session, and on CPU keeps each projection as an (in, out) contiguous copy because
MKL's matrix-vector product reads that layout about 1.6x faster than nn.Linear's (out, in)
(measured on this project's machine; on other devices the original weights are used as
transposed views, with no copy). The copies cost one extra model's worth of memory while a
``FastDecoder`` is alive; ``generate`` keeps one per model and rebuilds it when the weights
change.

It covers the configurations of the shared core it knows (every norm, activation, position
scheme, MHA/GQA/MQA, pre/post norm, biases or not): ``HANDLED_FIELDS`` lists the ModelConfig
fields it honours, and any other field away from its default (a switch added later) keeps a
model off this path, as does any module it does not know. ``FastDecoder.supports`` says why a
model is not covered, and the session then uses the model's own forward. Tests check that both
paths give the same logits at every step.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import non_default_fields
from tformer.nn.attention import KVCache
from tformer.nn.position import apply_rotary

# The ModelConfig fields this path computes exactly. Dropout and initialisation do not act when
# decoding; token ids and ``extra`` are metadata. Everything else must hold its default.
HANDLED_FIELDS = frozenset({
    "vocab_size", "max_seq_len", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "d_ff",
    "activation", "norm", "norm_position", "norm_eps", "norm_bias", "positional", "rope_theta", "sinusoidal_layout",
    "relative_num_buckets", "relative_max_distance", "dropout", "attention_dropout", "bias", "attention_bias",
    "feedforward_bias", "tie_embeddings", "scale_embeddings", "initializer_range", "pad_token_id",
    "bos_token_id", "eos_token_id", "extra",
})
_MODEL_CHILDREN = {"embedding", "stack", "lm_head"}
_EMBEDDING_CHILDREN = {"token"}
_STACK_CHILDREN = {"positional", "dropout", "blocks", "final_norm"}
_BLOCK_CHILDREN = {"attention_norm", "attention", "feedforward_norm", "feedforward", "dropout"}
_ATTENTION_CHILDREN = {"qkv_proj", "out_proj"}
_FEEDFORWARD_CHILDREN = {"in_proj", "out_proj"}
_POSITIONAL_KINDS = ("learned", "sinusoidal", "rope", "alibi", "relative", "none")
# Smaller projections stay in cache and gain nothing from a second thread (measured here).
SPLIT_MIN_ELEMENTS = 1 << 17
# From this many rows, a large projection runs as W @ x.T: MKL is faster at a wide-by-skinny product
# than at a skinny-by-wide one (1.1-1.5x for 16 rows on GPT-2's shapes, measured here).
TRANSPOSED_MIN_ROWS = 8


@dataclass
class _Norm:
    """A LayerNorm or RMSNorm as plain tensors."""

    kind: str  # "layernorm" | "rmsnorm"
    weight: Tensor | None
    bias: Tensor | None
    eps: float

    def __call__(self, x: Tensor) -> Tensor:
        shape = (x.shape[-1],)
        if self.kind == "layernorm":
            return torch.layer_norm(x, shape, self.weight, self.bias, self.eps)
        return torch.rms_norm(x, shape, self.weight, self.eps)


class _Projection:
    """A linear layer as ``x @ weight_in_out + bias`` on 2-D inputs (N, in) -> (N, out).

    With ``parts > 1`` the input dimension is cut into that many slices whose partial products
    run as one batched product (one slice per thread) and are then summed: at batch 1, MKL
    runs a matrix-vector product of a few MB on one thread, and the batched form reads the
    weights with every thread, about 1.4x faster on two cores (measured here).
    """

    def __init__(self, weight_in_out: Tensor, bias: Tensor | None, parts: int = 1,
                 weight_out_in: Tensor | None = None) -> None:
        self.weight_in_out = weight_in_out  # (in, out)
        self.bias = bias
        size_in, size_out = weight_in_out.shape
        split = parts > 1 and size_in % parts == 0 and weight_in_out.numel() >= SPLIT_MIN_ELEMENTS
        self.parts = parts if split and weight_in_out.is_contiguous() else 1
        # (out, in), contiguous: the same weights for many rows at once (see TRANSPOSED_MIN_ROWS)
        large = weight_in_out.numel() >= SPLIT_MIN_ELEMENTS
        self.weight_out_in = weight_out_in if large and weight_out_in is not None else None
        self.bias_column = None if bias is None else bias[:, None]
        if self.parts > 1:
            self.weight_parts = weight_in_out.view(self.parts, size_in // self.parts, size_out)  # no copy
            # The bias joins the first slice's partial product: (parts, 1, out), zeros after the first.
            self.bias_parts = None
            if bias is not None:
                self.bias_parts = torch.zeros(self.parts, 1, size_out, dtype=bias.dtype, device=bias.device)
                self.bias_parts[0, 0] = bias

    def __call__(self, x: Tensor) -> Tensor:
        if self.weight_out_in is not None and x.shape[0] >= TRANSPOSED_MIN_ROWS:
            if self.bias_column is None:
                return torch.mm(self.weight_out_in, x.t()).t().contiguous()
            return torch.addmm(self.bias_column, self.weight_out_in, x.t()).t().contiguous()
        if self.parts > 1:
            rows = x.shape[0]
            slices = x.reshape(rows, self.parts, -1).transpose(0, 1)  # (parts, N, in / parts)
            if self.bias_parts is None:
                return torch.bmm(slices, self.weight_parts).sum(0)
            return torch.baddbmm(self.bias_parts, slices, self.weight_parts).sum(0)
        if self.bias is None:
            return torch.mm(x, self.weight_in_out)
        return torch.addmm(self.bias, x, self.weight_in_out)


@dataclass
class _Layer:
    attention_norm: _Norm
    qkv: _Projection
    attention_out: _Projection
    feedforward_norm: _Norm
    feedforward_in: _Projection
    feedforward_out: _Projection
    activate: Callable[[Tensor], Tensor]  # the FeedForward's own activation (gated or not)


class FastDecoderUnsupported(Exception):
    """The model has a part the fast path does not know; the reason says which."""


class FastDecoder:
    """A DecoderLM's weights laid out for decoding, and its forward over a key/value cache."""

    def __init__(self, model: nn.Module) -> None:
        reason = self.supports(model)
        if reason is not None:
            raise FastDecoderUnsupported(reason)
        config = model.config
        self.config = config
        self.device = model.lm_head.weight.device
        self.dtype = model.lm_head.weight.dtype
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.pre_norm = config.norm_position == "pre"
        self.embedding_scale = math.sqrt(config.d_model) if config.scale_embeddings else None
        stack = model.stack
        self.token_embedding = model.embedding.token.weight  # (V, D), looked up by row
        self.positional = stack.positional  # the session asks it for ALiBi / relative biases
        self.position_table = self._position_table(stack.positional)
        self.inverse_frequencies = (
            stack.positional.rotary.inverse_frequencies if stack.positional.kind == "rope" else None
        )
        self._rotary_cos = self._rotary_sin = None
        copy = self.device.type == "cpu"
        self.threads = _layout_threads(self.device)
        self.layers = [self._layer(block, copy) for block in stack.blocks]
        self.final_norm = self._norm(stack.final_norm) if self.pre_norm else None
        self.lm_head = self._projection(model.lm_head, copy)
        self._sources = _parameter_fingerprint(model)
        self._model = weakref.ref(model)

    # ---- construction ------------------------------------------------------------------------

    @staticmethod
    def supports(model: nn.Module) -> str | None:
        """None when the fast path computes this model exactly, else the reason it does not."""
        if not hasattr(model, "config"):
            return f"{type(model).__name__} has no config"
        unhandled = [name for name in non_default_fields(model.config) if name not in HANDLED_FIELDS]
        if unhandled:
            return "config " + ", ".join(f"{name}={getattr(model.config, name)!r}" for name in unhandled)
        for owner, children, known in (
            ("the model", _children(model), _MODEL_CHILDREN),
            ("the embedding", _children(getattr(model, "embedding", None)), _EMBEDDING_CHILDREN),
            ("the stack", _children(getattr(model, "stack", None)), _STACK_CHILDREN),
        ):
            if children != known:
                return f"{owner} has parts {sorted(children)} (known: {sorted(known)})"
        stack = model.stack
        if not getattr(stack, "causal", False):
            return "the stack is not causal"
        if stack.positional.kind not in _POSITIONAL_KINDS:
            return f"positional={stack.positional.kind!r}"
        if model.lm_head.bias is not None:
            return "the LM head has a bias"
        for index, block in enumerate(stack.blocks):
            children = {name for name, _ in block.named_children()}
            if children != _BLOCK_CHILDREN or getattr(block, "cross_attention", None) is not None:
                return f"block {index} has parts {sorted(children)}"
            if {name for name, _ in block.attention.named_children()} != _ATTENTION_CHILDREN:
                return f"block {index} attention is not a fused self-attention"
            if {name for name, _ in block.feedforward.named_children()} != _FEEDFORWARD_CHILDREN:
                return f"block {index} feed-forward has unknown parts"
            for norm in (block.attention_norm, block.feedforward_norm):
                if _norm_kind(norm) is None:
                    return f"block {index} has a {type(norm).__name__}"
        if model.config.norm_position == "pre" and _norm_kind(stack.final_norm) is None:
            return f"final norm is a {type(stack.final_norm).__name__}"
        return None

    def is_current_for(self, model: nn.Module) -> bool:
        """Whether this decoder was built from ``model`` and its weights have not changed since."""
        return (self._model() is model and self._sources is not None and self._sources == _parameter_fingerprint(model)
                and self.threads == _layout_threads(self.device))

    @staticmethod
    def _position_table(positional) -> Tensor | None:
        if positional.kind == "learned":
            return positional.absolute.embedding.weight
        if positional.kind == "sinusoidal":
            return positional.absolute.table
        return None

    @staticmethod
    def _norm(module: nn.Module) -> _Norm:
        kind = _norm_kind(module)
        eps = module.eps
        return _Norm(kind, module.weight, getattr(module, "bias", None), eps)

    def _projection(self, linear: nn.Linear, copy: bool) -> _Projection:
        weight = linear.weight.detach().t()
        if not copy:
            return _Projection(weight, linear.bias)
        original = linear.weight.detach()
        return _Projection(weight.contiguous(), linear.bias, parts=self.threads,
                           weight_out_in=original if original.is_contiguous() else None)

    def _layer(self, block: nn.Module, copy: bool) -> _Layer:
        return _Layer(
            attention_norm=self._norm(block.attention_norm),
            qkv=self._projection(block.attention.qkv_proj, copy),
            attention_out=self._projection(block.attention.out_proj, copy),
            feedforward_norm=self._norm(block.feedforward_norm),
            feedforward_in=self._projection(block.feedforward.in_proj, copy),
            feedforward_out=self._projection(block.feedforward.out_proj, copy),
            activate=block.feedforward.activate,
        )

    # ---- the forward -------------------------------------------------------------------------

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        caches: list[KVCache],
        mask: Tensor | None,
        last_only: bool = False,
    ) -> Tensor:
        """Run ``input_ids`` (B, T) at ``positions`` (B, T) after the ``caches``' contents.

        ``mask``: additive, broadcastable to (B, H, T, past + T), or None when every query may
        see every key (one new token, no padding, no position bias). Appends the new keys and
        values to the caches. Returns logits (B, T, V), or (B, 1, V) for the last position only.
        """
        batch, length = input_ids.shape
        past = caches[0].length
        end = past + length
        rotary = self._rotary(positions) if self.inverse_frequencies is not None else None
        x = F.embedding(input_ids, self.token_embedding)  # (B, T, D)
        if self.embedding_scale is not None:
            x = x * self.embedding_scale
        if self.position_table is not None:
            x = x + F.embedding(positions, self.position_table)
        x = x.reshape(batch * length, -1)  # (B*T, D): projections are plain matrix products
        for layer, cache in zip(self.layers, caches, strict=True):
            x = self._block(layer, x, cache, batch, length, past, end, mask, rotary)
            cache.length = end
        if last_only and length > 1:
            x = x.view(batch, length, -1)[:, -1]
            length = 1
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.lm_head(x).view(batch, length, -1)

    def _block(self, layer: _Layer, x: Tensor, cache: KVCache, batch: int, length: int, past: int, end: int,
               mask: Tensor | None, rotary: tuple[Tensor, Tensor] | None) -> Tensor:
        if self.pre_norm:
            x = x + self._attention(layer, layer.attention_norm(x), cache, batch, length, past, end, mask, rotary)
            return x + self._feedforward(layer, layer.feedforward_norm(x))
        x = layer.attention_norm(x + self._attention(layer, x, cache, batch, length, past, end, mask, rotary))
        return layer.feedforward_norm(x + self._feedforward(layer, x))

    def _attention(self, layer: _Layer, h: Tensor, cache: KVCache, batch: int, length: int, past: int, end: int,
                   mask: Tensor | None, rotary: tuple[Tensor, Tensor] | None) -> Tensor:
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = layer.qkv(h).split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q = q.view(batch, length, heads, head_dim).transpose(1, 2)  # (B, H, T, Dh)
        k = k.view(batch, length, kv_heads, head_dim).transpose(1, 2)  # (B, Hkv, T, Dh)
        v = v.view(batch, length, kv_heads, head_dim).transpose(1, 2)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        cache.keys.narrow(2, past, length).copy_(k)
        cache.values.narrow(2, past, length).copy_(v)
        out = F.scaled_dot_product_attention(
            q, cache.keys.narrow(2, 0, end), cache.values.narrow(2, 0, end), attn_mask=mask,
            enable_gqa=kv_heads != heads,
        )  # (B, H, T, Dh)
        return layer.attention_out(out.transpose(1, 2).reshape(batch * length, heads * head_dim))

    @staticmethod
    def _feedforward(layer: _Layer, h: Tensor) -> Tensor:
        return layer.feedforward_out(layer.activate(layer.feedforward_in(h)))

    def reserve_positions(self, count: int) -> None:
        """Make positions 0 .. count-1 usable (rotary tables); called once per session, so the
        steps themselves never inspect their positions."""
        if self.inverse_frequencies is None or (self._rotary_cos is not None and self._rotary_cos.shape[0] >= count):
            return
        # Exactly what RotaryEmbedding computes for each position, tabulated once.
        angles = torch.arange(count, device=self.device).float().unsqueeze(-1) * self.inverse_frequencies
        angles = torch.cat([angles, angles], dim=-1)  # (count, Dh)
        self._rotary_cos, self._rotary_sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def _rotary(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin (B, 1, T, Dh) for ``positions`` (B, T) from the reserved table."""
        return self._rotary_cos[positions].unsqueeze(1), self._rotary_sin[positions].unsqueeze(1)


def _layout_threads(device: torch.device) -> int:
    """The thread count CPU projections are split for (one slice per thread); 1 elsewhere."""
    return torch.get_num_threads() if device.type == "cpu" else 1


def _children(module: nn.Module | None) -> set[str]:
    return set() if module is None else {name for name, _ in module.named_children()}


def _norm_kind(module: nn.Module) -> str | None:
    if isinstance(module, nn.LayerNorm):
        return "layernorm"
    if type(module).__name__ == "RMSNorm" and hasattr(module, "eps") and hasattr(module, "weight"):
        return "rmsnorm"
    return None


def _parameter_fingerprint(model: nn.Module) -> tuple | None:
    """Identity and in-place version of every parameter and buffer: changes when weights do.

    None when a tensor keeps no version counter (made under inference mode): never current."""
    fingerprint = []
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_inference():
            return None
        fingerprint.append((tensor.data_ptr(), tensor._version, tensor.dtype, tensor.device))
    return tuple(fingerprint)


_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fast_decoder_for(model: nn.Module) -> FastDecoder | None:
    """The model's FastDecoder (built once, rebuilt when its weights change), or None when the
    fast path does not cover it."""
    decoder = _DECODERS.get(model)
    if decoder is not None and decoder.is_current_for(model):
        return decoder
    _DECODERS.pop(model, None)
    if FastDecoder.supports(model) is not None:
        return None
    with torch.inference_mode():
        decoder = FastDecoder(model)
    _DECODERS[model] = decoder
    return decoder
