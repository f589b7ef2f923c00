"""DecoderLM: a GPT-style causal language model on the shared core."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.models.base import Model
from tformer.models.output import ModelOutput
from tformer.nn.attention import KVCache, build_mask
from tformer.nn.block import AttentionContext, LayerCache, TransformerBlock
from tformer.nn.losses import next_token_loss
from tformer.nn.norm import build_norm
from tformer.nn.position import positional_from_config, positions_from_mask


class DecoderLM(Model):
    """Token embeddings (+ positions) -> causal TransformerBlocks -> final norm -> LM head."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.positional = positional_from_config(config, causal=True)
        self.embedding_dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))
        # Post-norm blocks end in a norm already; pre-norm stacks need one before the head.
        self.final_norm = (
            build_norm(config.norm, config.d_model, config.norm_eps, config.norm_bias)
            if config.norm_position == "pre" else nn.Identity()
        )
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.token_embedding.weight

    def tied_parameters(self) -> dict[str, str]:
        return {"lm_head.weight": "token_embedding.weight"} if self.config.tie_embeddings else {}

    def new_cache(
        self, batch_size: int, max_len: int, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> list[LayerCache]:
        """Empty preallocated key/value caches for decoding up to ``max_len`` positions."""
        config = self.config
        dtype = dtype or self.dtype
        device = device or self.device
        return [
            LayerCache(KVCache(batch_size, config.num_kv_heads, max_len, config.head_dim, dtype, device))
            for _ in range(config.num_layers)
        ]

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: list[LayerCache] | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> ModelOutput:
        """input_ids: (B, T). ``attention_mask`` (B, past + T), 1 = attend, covers cached positions
        too. ``labels`` (B, T) are aligned with the inputs (shifted inside); -100 is ignored."""
        self._check_inputs(input_ids, attention_mask, cache)
        batch, length = input_ids.shape
        past = 0 if cache is None else cache[0].self_attention.length
        key_positions = self._key_positions(batch, past + length, attention_mask, input_ids.device)
        if position_ids is None:
            position_ids = key_positions[:, past:]
        self._check_positions(position_ids)

        x = self.token_embedding(input_ids)  # (B, T, D)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        absolute = self.positional.embeddings(position_ids)
        if absolute is not None:
            x = x + absolute
        x = self.embedding_dropout(x)

        mask, is_causal = build_mask(
            length, past + length, causal=True, attention_mask=attention_mask,
            position_bias=self.positional.attention_bias(position_ids, key_positions),
            dtype=x.dtype, device=x.device,
        )
        context = AttentionContext(
            mask=mask, is_causal=is_causal, rotary=self.positional.rotary_angles(position_ids, x.dtype),
            need_weights=output_attentions,
        )
        hidden_states: list[Tensor] = []
        attentions: list[Tensor] = []
        for index, block in enumerate(self.blocks):
            if output_hidden_states:
                hidden_states.append(x)
            x, weights = block(x, context, None if cache is None else cache[index])
            attentions.extend(weights)
        x = self.final_norm(x)
        if output_hidden_states:
            hidden_states.append(x)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None if labels is None else next_token_loss(logits, labels)
        return ModelOutput(
            logits=logits, loss=loss,
            attentions=attentions if output_attentions else None,
            hidden_states=hidden_states if output_hidden_states else None,
            cache=cache,
        )

    # ---- input checks and positions ------------------------------------------------------------

    def _key_positions(self, batch: int, total: int, attention_mask: Tensor | None, device) -> Tensor:
        """(B, past + T) position of every key: counted over attended tokens when padded."""
        if attention_mask is not None:
            return positions_from_mask(attention_mask)
        return torch.arange(total, device=device).expand(batch, total)

    def _check_inputs(self, input_ids: Tensor, attention_mask: Tensor | None, cache) -> None:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, length), got {tuple(input_ids.shape)}")
        if input_ids.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
        if input_ids.numel() and not torch.compiler.is_compiling():  # value checks sync: skipped when compiled
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= self.config.vocab_size:
                bad = low if low < 0 else high
                raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")
        if attention_mask is not None:
            past = 0 if cache is None else cache[0].self_attention.length
            expected = (input_ids.shape[0], past + input_ids.shape[1])
            if tuple(attention_mask.shape) != expected:
                raise ValueError(
                    f"attention_mask must have shape {expected} (batch, cached + new tokens), "
                    f"got {tuple(attention_mask.shape)}"
                )

    def _check_positions(self, position_ids: Tensor) -> None:
        if torch.compiler.is_compiling() or not (self.positional.has_table and position_ids.numel()):
            return
        if int(position_ids.max()) >= self.config.max_seq_len:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond max_seq_len={self.config.max_seq_len} "
                f"of this model's {self.config.positional} position table; use at most "
                f"{self.config.max_seq_len} tokens"
            )

    # ---- generation hooks (the Session protocol: tformer/generation/session.py) --------------------
    # new_cache (above) and forward(..., cache=...) are hooks too.

    def prepare_generation(self, input_ids: Tensor, attention_mask: Tensor | None = None):
        """A ``GenerationState`` of the prompt as it is: a decoder has nothing to encode, and its steps
        need nothing but tokens."""
        from tformer.generation.session import GenerationState  # models do not import generation at load

        return GenerationState(input_ids=input_ids, attention_mask=attention_mask)

    @property
    def position_limit(self) -> int | None:
        """The most positions this model takes: ``max_seq_len`` when positions index a table, else None."""
        return self.config.max_seq_len if self.positional.has_table else None
