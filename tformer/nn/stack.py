"""TransformerStack: positions, N TransformerBlocks and the final norm, causal or bidirectional,
with or without cross-attention to an encoder's hidden states. Every model runs one (or two)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tformer.config import ModelConfig
from tformer.nn.attention import CrossAttentionCache, StepLayout, kernel_class
from tformer.nn.attention.cache_spec import LayerCacheSpec
from tformer.nn.attention.mask import packed_segments
from tformer.nn.block import AttentionContext, LayerCache, TransformerBlock
from tformer.nn.inputs import check_attention_mask, check_positions
from tformer.nn.norm import build_norm
from tformer.nn.positions import positional_from_config, positions_from_mask

# The ModelConfig fields that a pass laid out outside the stack (a decoding session's StepLayout, the
# serving engine's paged layout) is known to compute exactly: the layout carries positions and padding,
# the stack builds everything else from the config as its forward does. A field added later is not here
# until someone checks the layouts honour it; a model whose config sets it away from its default then
# decodes through its own forward and the engine refuses it (fail closed). Grouped by what they shape.
LAYOUT_FIELDS = frozenset({
    # sizes, the block and its attention
    "architecture", "vocab_size", "max_seq_len", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
    "d_ff", "activation", "norm", "norm_position", "norm_eps", "norm_bias", "bias", "attention_bias",
    "feedforward_bias", "attention_kernel", "performer_features", "performer_redraw_interval", "attention_window",
    "key_bias", "output_bias",  # MultiHeadAttention's own: every pass through it honours them
    # per-layer windows (each layer's kernel and cache backend), the scores' scale and cap (the kernels'), the
    # logits' cap (DecoderLM.step applies it as forward does)
    "layer_attention_windows", "query_pre_attn_scalar", "attention_softcap", "final_logit_softcap",
    # the feed-forward as a mixture of experts (nn/experts.py): it reads rows, as every pass hands them
    "num_experts", "num_experts_per_token", "moe_d_ff", "norm_topk_prob", "shared_expert_d_ff", "shared_expert_gate",
    # positions (the layout's own business: counted over real tokens, as forward counts them)
    "positional", "rope_theta", "rope_scaling", "partial_rotary_factor", "sinusoidal_layout", "relative_num_buckets",
    "relative_max_distance",
    # embeddings and heads of the families that decode
    "tie_embeddings", "scale_embeddings", "embedding_norm", "num_encoder_layers", "lm_head_bias",
    "scale_decoder_output",
    # not read when decoding: training only (dropout, initialisation) or metadata (ids, labels, the other families)
    "dropout", "attention_dropout", "initializer_range", "initializer", "pad_token_id", "bos_token_id", "eos_token_id",
    "decoder_start_token_id", "forced_eos_token_id", "extra", "type_vocab_size", "head", "num_labels", "problem_type",
    "label_names", "position_offset", "pooler_input_dropout", "image_size", "patch_size", "num_channels", "pooling",
    "rnn_cell", "rnn_attention", "rnn_hidden_size", "input_feeding", "teacher_forcing_ratio",
    "suppress_tokens", "begin_suppress_tokens",  # generation's defaults, read by its TokenChooser
    "router_aux_loss_coef",  # a mixture of experts' load-balancing loss: training only
    "ctc_weight",  # a speech model's training objective: its CTC head reads the encoder, never a decoding step
    # a speech model's audio front end: its encoder runs through forward, once, before any step is laid out
    "num_mel_bins", "max_source_positions", "feature_normalization",
})


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
    ``activation_checkpointing``: while training, each block's activations are recomputed in the backward
    pass instead of kept (``torch.utils.checkpoint``; the same gradients, less memory, one more forward).
    """

    activation_checkpointing = False

    def __init__(self, config: ModelConfig, causal: bool, cross_attention: bool = False,
                 add_positions: bool = True) -> None:
        super().__init__()
        self.config = config
        self.causal = causal
        self.cross_attention = cross_attention
        self.positional = positional_from_config(config, causal=causal, kind=None if add_positions else "none")

        def norm() -> nn.Module:
            return build_norm(config.norm, config.d_model, config.norm_eps, config.norm_bias)

        self.embedding_norm = norm() if config.embedding_norm else None  # BERT: after embeddings + positions
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(TransformerBlock(config, cross_attention, layer)
                                    for layer in range(config.num_layers))
        # Post-norm blocks end in a norm already; pre-norm (and sandwich) stacks need one before the head.
        self.final_norm = norm() if config.norm_position in ("pre", "sandwich") else nn.Identity()

    @property
    def position_limit(self) -> int | None:
        """The number of positions when they index a fixed table (learned, sinusoidal), else None."""
        return self.positional.max_len if self.positional.has_table else None

    def new_cache(self, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device) -> list[LayerCache]:
        """Empty caches for decoding up to ``max_len`` positions, one per block: its kernel's self-attention
        backend (a dense key/value cache; a sliding window's keeps its last positions, Performer's a running
        state), and with cross-attention a slot the first step fills with the encoder's keys and values."""
        return [LayerCache(block.attention.new_cache(batch_size, max_len, dtype, device),
                           CrossAttentionCache() if self.cross_attention else None) for block in self.blocks]

    def cache_specs(self) -> list[LayerCacheSpec]:
        """What each block keeps between decoding steps, declared (``new_cache``'s backends, as specs)."""
        return [LayerCacheSpec(block.attention.cache_spec(),
                               None if block.cross_attention is None else block.cross_attention.cache_spec())
                for block in self.blocks]

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
        (B, S, D) and ``encoder_mask`` (B, S), 1 = attend, feed cross-attention. Without an attention mask
        or a cache, ``position_ids`` that restart inside a row mark packed examples (``packed_segments``, Hugging
        Face's rule): no token attends across a restart. Checks its inputs, lays out the pass (``StepLayout``)
        and runs it (``run``)."""
        if encoder_hidden is not None and not self.cross_attention:
            raise ValueError("encoder_hidden given, but this stack has no cross-attention (cross_attention=False)")
        batch, length, _ = x.shape
        past = 0 if cache is None else cache[0].self_attention.length
        if attention_mask is not None:
            check_attention_mask(attention_mask, (batch, past + length))
        key_positions = _key_positions(batch, past + length, attention_mask, x.device)  # (B, past + T)
        packed = position_ids is not None and attention_mask is None and cache is None and length > 1
        if position_ids is None:
            position_ids = key_positions[:, past:]
        check_positions(position_ids, self.position_limit, self.positional.kind)
        segments = None
        if packed:  # the caller's positions: they may restart (packed examples)
            position_ids = position_ids.expand(batch, length)
            segments = packed_segments(position_ids)
            if segments is not None:
                self._check_packing()
                key_positions = position_ids  # keys are the new tokens: a position bias reads their own positions
        for kernel in self.config.attention_kernels:
            if output_attentions and not kernel_class(kernel).weights:
                raise ValueError(f"attention_kernel={kernel!r} has no attention weights (output_attentions=True); "
                                 "use an exact kernel (sdpa, reference, chunked) to inspect them")
        layout = StepLayout(position_ids, key_positions, None if attention_mask is None else attention_mask.bool(),
                            segments=segments)
        return self.run(x, layout, cache, encoder_hidden, None if encoder_mask is None else encoder_mask.bool(),
                        output_attentions=output_attentions, output_hidden_states=output_hidden_states)

    def _check_packing(self) -> None:
        """Refuse packed rows (positions restarting) where a layer's kernel cannot keep the examples apart."""
        for block in self.blocks:
            kernel = block.attention.kernel
            if not kernel.segments:
                raise ValueError(f"position_ids restart inside a row (packed examples), which "
                                 f"attention_kernel={kernel.name!r} cannot keep apart; give one example a row, or "
                                 "use the sdpa or reference kernel")

    def run(
        self,
        x: Tensor,
        layout: StepLayout,
        cache: list[LayerCache] | None = None,
        encoder_hidden: Tensor | None = None,
        encoder_padding: Tensor | None = None,
        *,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> StackOutput:
        """The pass itself, for inputs already checked: ``forward``'s, or a decoding session's and the
        serving engine's, which check theirs once and lay out every step from their own tables. Positions,
        the mask and rotary angles are built here once and shared by every block. ``encoder_padding``
        (B, S) bool, True = a real source token."""
        parts = self._modules  # read directly: a decoding step runs this once per token
        positional = parts["positional"]
        absolute = positional.embeddings(layout.positions)
        if absolute is not None:
            x = x + absolute
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        if self.training:
            x = self.dropout(x)
        batch, length, width = x.shape
        context = AttentionContext(
            mask=layout.attention_mask(self.causal, positional.bias if positional.adds_bias else None),
            rotary=positional.rotary_angles(layout.positions, x.dtype),
            encoder_output=encoder_hidden,
            encoder_mask=layout.encoder_mask(encoder_padding),
            need_weights=output_attentions,
            shape=(batch, length),
        )
        x = x.reshape(batch * length, width)  # the blocks read rows; only attention needs (B, T)
        hidden_states: list[Tensor] = []
        attentions: list[Tensor] = []
        cross_attentions: list[Tensor] = []
        recompute = self.activation_checkpointing and self.training and cache is None and torch.is_grad_enabled()
        for index, block in enumerate(parts["blocks"]):
            if output_hidden_states:
                hidden_states.append(x.view(batch, length, width))
            layer_cache = None if cache is None else cache[index]
            if recompute:  # the block's activations recomputed in the backward pass (dropout's masks the same)
                x, self_weights, cross_weights = checkpoint(block, x, context, None, use_reentrant=False)
            else:
                x, self_weights, cross_weights = block(x, context, layer_cache)
            if output_attentions:
                attentions.append(self_weights)
                if cross_weights is not None:
                    cross_attentions.append(cross_weights)
        x = x.view(batch, length, width)
        if layout.keep is not None:
            x = x[:, layout.keep]
        x = parts["final_norm"](x)
        if output_hidden_states:
            hidden_states.append(x)
        return StackOutput(
            hidden=x,
            attentions=attentions if output_attentions else None,
            cross_attentions=cross_attentions if output_attentions and cross_attentions else None,
            hidden_states=hidden_states if output_hidden_states else None,
        )


def set_activation_checkpointing(model: nn.Module, enabled: bool = True) -> int:
    """Turn activation checkpointing on (or off) in every stack of ``model``; how many stacks there are."""
    stacks = [module for module in model.modules() if isinstance(module, TransformerStack)]
    for stack in stacks:
        stack.activation_checkpointing = enabled
    return len(stacks)


def _key_positions(batch: int, total: int, attention_mask: Tensor | None, device: torch.device) -> Tensor:
    """(B, past + T) position of every key: counted over attended tokens when padded."""
    if attention_mask is not None:
        return positions_from_mask(attention_mask)
    return torch.arange(total, device=device).expand(batch, total)
