"""DecoderLM: a GPT-style causal language model on the shared core."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.config import GENERATION_DEFAULT_FIELDS, TOKEN_FIELDS, TOKEN_POSITION_FIELDS, ModelConfig
from tformer.models.base import Model, head_outputs
from tformer.models.output import GenerationState, ModelOutput
from tformer.models.registry import register
from tformer.nn.attention import StepLayout
from tformer.nn.attention.cache_spec import LayerCacheSpec
from tformer.nn.attention.reference import soft_cap
from tformer.nn.block import LayerCache
from tformer.nn.embeddings import TokenEmbedding
from tformer.nn.heads import LMHead
from tformer.nn.inputs import check_token_ids
from tformer.nn.losses import next_token_targets
from tformer.nn.stack import TransformerStack

DECODER_PRESETS = {
    # GPT-2 small: 124,439,808 parameters with the tied LM head.
    "gpt2": dict(
        vocab_size=50257, max_seq_len=1024, d_model=768, num_layers=12, num_heads=12,
        activation="gelu_tanh", norm="layernorm", positional="learned", bias=True,
        tie_embeddings=True, bos_token_id=50256, eos_token_id=50256,
    ),
    # A Llama-shaped small decoder: RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases.
    "llama-small": dict(
        vocab_size=32000, max_seq_len=2048, d_model=512, num_layers=8, num_heads=8,
        num_kv_heads=2, activation="swiglu", norm="rmsnorm", norm_eps=1e-6, positional="rope",
        bias=False, tie_embeddings=False,
    ),
    # A few million parameters: trains on a laptop CPU in minutes (the demo's model).
    "gpt-mini": dict(
        vocab_size=256, max_seq_len=256, d_model=192, num_layers=6, num_heads=6,
        activation="gelu_tanh", positional="learned", dropout=0.0,
    ),
    # For tests: tiny and fast.
    "gpt-nano": dict(
        vocab_size=64, max_seq_len=64, d_model=32, num_layers=2, num_heads=4,
        activation="gelu_tanh", positional="learned",
    ),
}


# A sliding window on some layers only (layer_attention_windows) and the logits' soft cap (final_logit_softcap):
# the decoder's alone (an encoder-decoder's encoder has other depths)
DECODER_FIELDS = ("layer_attention_windows", "final_logit_softcap")


@register("decoder", fields=(*TOKEN_FIELDS, *TOKEN_POSITION_FIELDS, *GENERATION_DEFAULT_FIELDS, *DECODER_FIELDS),
          presets=DECODER_PRESETS)
class DecoderLM(Model):
    """Token embedding -> causal TransformerStack (positions, blocks, final norm) -> LM head (its logits capped
    by ``final_logit_softcap`` when set, Gemma 2)."""

    generates = True
    loss_alone = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.embedding = TokenEmbedding.from_config(config)
        self.stack = TransformerStack(config, causal=True)
        self.lm_head = LMHead(config.d_model, config.vocab_size)
        self.init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.embedding.token.weight

    def tied_parameters(self) -> dict[str, str]:
        return {"lm_head.weight": "embedding.token.weight"} if self.config.tie_embeddings else {}

    def new_cache(
        self, batch_size: int, max_len: int, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> list[LayerCache]:
        """Empty preallocated key/value caches for decoding up to ``max_len`` positions."""
        return self.stack.new_cache(batch_size, max_len, dtype or self.dtype, device or self.device)

    def cache_specs(self) -> list[LayerCacheSpec]:
        return self.stack.cache_specs()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: list[LayerCache] | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_logits: bool = True,
        label_smoothing: float = 0.0,
    ) -> ModelOutput:
        """input_ids: (B, T). ``attention_mask`` (B, past + T), 1 = attend, covers cached positions
        too. ``labels`` (B, T) are aligned with the inputs (shifted inside), or (B, T + 1): the inputs and the
        token after them, which the last position then predicts (the lm task's crops); -100 is ignored.
        ``return_logits`` False (with labels): the loss only (``head_outputs``: no (B, T, V) logits held,
        training's largest activations), the output's ``logits`` None. ``label_smoothing``: the loss's."""
        check_token_ids(input_ids, self.config.vocab_size)
        stack = self.stack(
            self.embedding(input_ids), attention_mask=attention_mask, position_ids=position_ids, cache=cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
        )
        targets = None if labels is None else next_token_targets(labels, stack.hidden.shape[1])  # (B, T)
        logits, loss = head_outputs(self, stack.hidden, targets, return_logits, label_smoothing)
        return ModelOutput(
            logits=logits, loss=loss, attentions=stack.attentions, hidden_states=stack.hidden_states, cache=cache,
        )

    def _logits(self, hidden: Tensor) -> Tensor:
        return soft_cap(self.lm_head(hidden), self.config.final_logit_softcap)

    # ---- generation hooks (the Session protocol: tformer/generation/session.py) --------------------
    # new_cache, forward(..., cache=...) and position_limit are hooks too.

    def step(self, input_ids: Tensor, layout: StepLayout, cache: list[LayerCache]) -> Tensor:
        """A decoding step: ``input_ids`` (B, T) after the cached tokens, laid out by the caller (positions,
        padding, the rows it wants), unchecked: a session checks its prompt once. Logits (B, kept rows, V)."""
        parts = self._modules
        hidden = parts["stack"].run(parts["embedding"](input_ids), layout, cache).hidden
        return soft_cap(parts["lm_head"](hidden), self.config.final_logit_softcap)

    def prepare_generation(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> GenerationState:
        """The prompt as it is: a decoder has nothing to encode, and its steps need nothing but tokens."""
        return GenerationState(input_ids=input_ids, attention_mask=attention_mask)
