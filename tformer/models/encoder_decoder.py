"""EncoderDecoderLM: the 2017 translation model on the shared core: a bidirectional encoder
stack over the source, a causal decoder stack whose blocks cross-attend to the encoder's output,
one token table for both sides (a joint vocabulary) and the output.

Encoder-decoder fields (``architecture="encoder_decoder"``, the 2017 translation model): a
bidirectional encoder of ``num_encoder_layers`` blocks (default: ``num_layers``) and a causal decoder
of ``num_layers`` blocks that cross-attend to its output; one token table for source, target and
(``tie_embeddings``) output, a joint vocabulary; generation starts the decoder at
``decoder_start_token_id`` (default: ``bos_token_id``, else ``pad_token_id`` as Marian);
``forced_eos_token_id`` (any text family; Marian's, BART's) makes generation end a sequence that reaches
its length limit with this token, as Hugging Face's ``ForcedEOSTokenLogitsProcessor`` does;
``lm_head_bias`` adds a learned per-token bias to the logits (Marian's ``final_logits_bias``);
``scale_decoder_output`` multiplies the decoder's last hidden states by d_model^-0.5 before the
output layer (T5 with a tied output); ``initializer = "t5"`` draws a new model's weights as T5 does.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tformer.config import GENERATION_DEFAULT_FIELDS, TOKEN_FIELDS, TOKEN_POSITION_FIELDS, ModelConfig
from tformer.models.base import Seq2SeqModel, head_outputs, is_norm
from tformer.models.output import Seq2SeqOutput
from tformer.models.registry import register
from tformer.nn.attention import StepLayout
from tformer.nn.attention.cache_spec import LayerCacheSpec
from tformer.nn.block import LayerCache
from tformer.nn.embeddings import TokenEmbedding
from tformer.nn.heads import LMHead
from tformer.nn.inputs import check_token_ids
from tformer.nn.positions.biases import RelativePositionBias
from tformer.nn.stack import TransformerStack

# lm_head_bias: a per-token bias on the output logits (Marian's final_logits_bias); scale_decoder_output: T5's
# decoder states x d_model^-0.5 before the output; num_encoder_layers: the encoder's depth (num_layers: the
# decoder's); initializer: "t5" draws a new model as T5 does (init_weights).
ENCODER_DECODER_FIELDS = ("lm_head_bias", "scale_decoder_output", "num_encoder_layers", "decoder_start_token_id",
                          "initializer")


ENCODER_DECODER_PRESETS = {
    # The 2017 paper's base translation model: 6 + 6 post-norm layers, 512 wide, 2,048 feed-forward, 8 heads,
    # ReLU, sinusoidal positions, embeddings scaled by sqrt(512) and shared by source, target and output
    # (a joint 37,000-token BPE vocabulary), dropout 0.1.
    "transformer-base": dict(
        vocab_size=37000, max_seq_len=512, d_model=512, num_layers=6, num_heads=8, d_ff=2048, activation="relu",
        norm_position="post", positional="sinusoidal", scale_embeddings=True, dropout=0.1, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    ),
    # Multi30k-sized (29,000 training pairs): 3 + 3 layers, 256 wide, 512 feed-forward, 8 heads.
    "transformer-multi30k": dict(
        vocab_size=8000, max_seq_len=256, d_model=256, num_layers=3, num_heads=8, d_ff=512, activation="relu",
        norm_position="post", positional="sinusoidal", scale_embeddings=True, dropout=0.1, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    ),
}


@register("encoder_decoder",
          fields=(*TOKEN_FIELDS, *TOKEN_POSITION_FIELDS, *GENERATION_DEFAULT_FIELDS, *ENCODER_DECODER_FIELDS),
          presets=ENCODER_DECODER_PRESETS)
class EncoderDecoderLM(Seq2SeqModel):
    """Token embedding (shared) -> encoder stack over the source; token embedding -> decoder stack
    (causal, cross-attending) over the target -> LM head tied to the embedding."""

    loss_alone = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.embedding = TokenEmbedding.from_config(config)
        self.encoder = TransformerStack(config.replace(num_layers=config.num_encoder_layers), causal=False)
        self.decoder = TransformerStack(config, causal=True, cross_attention=True)
        self.lm_head = LMHead(config.d_model, config.vocab_size, bias=config.lm_head_bias)
        self.init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.embedding.token.weight

    def init_weights(self) -> None:
        """The base's draws, or with ``initializer = "t5"`` T5's (Hugging Face's ``T5PreTrainedModel``), each
        standard deviation times initializer_range / 0.02: linear layers normal(0, fan_in^-0.5) (the query's
        (d_model * d_kv)^-0.5 once tformer's 1/sqrt(d_kv) score scale is undone), the token table (and a learned
        position table, which T5 lacks) and an untied output normal(0, 1), the relative position bias tables
        normal(0, d_model^-0.5), norm weights the factor itself; biases zero."""
        super().init_weights()
        if self.config.initializer != "t5":
            return
        factor = self.config.initializer_range / 0.02
        for module in self.modules():
            if isinstance(module, nn.Linear):
                fan_in_std = 1.0 if isinstance(module, LMHead) else module.in_features ** -0.5
                nn.init.normal_(module.weight, 0.0, factor * fan_in_std)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, factor)
            elif is_norm(module) and getattr(module, "weight", None) is not None:
                nn.init.constant_(module.weight, factor)
        for module in self.modules():  # after the pass above, which drew their tables as token tables
            if isinstance(module, RelativePositionBias):
                nn.init.normal_(module.embedding.weight, 0.0, factor * self.config.d_model ** -0.5)

    @classmethod
    def estimated_parameters(cls, config: ModelConfig) -> int:
        """The token table (and untied output), the encoder's and decoder's layers, and the decoder's
        cross-attention projections."""
        embeddings = config.vocab_size * config.d_model * (1 if config.tie_embeddings else 2)
        cross_attention = 4 * config.num_heads * config.head_dim * config.d_model
        return (embeddings + (config.num_layers + config.num_encoder_layers) * cls.layer_parameters(config)
                + config.num_layers * cross_attention)

    def tied_parameters(self) -> dict[str, str]:
        return {"lm_head.weight": "embedding.token.weight"} if self.config.tie_embeddings else {}

    # ---- the two halves ------------------------------------------------------------------------

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None,
               output_attentions: bool = False):
        """The source (B, S), 1 = token in ``attention_mask`` -> the encoder's StackOutput, hidden (B, S, D)."""
        check_token_ids(input_ids, self.config.vocab_size)
        return self.encoder(self.embedding(input_ids), attention_mask=attention_mask,
                            output_attentions=output_attentions)

    def decode(self, decoder_input_ids: Tensor, encoder_output: Tensor, encoder_attention_mask: Tensor | None = None,
               decoder_attention_mask: Tensor | None = None, cache: list[LayerCache] | None = None,
               output_attentions: bool = False, output_hidden_states: bool = False):
        """Target tokens (B, T) after the cached ones, attending to ``encoder_output`` (B, S, D) -> StackOutput."""
        check_token_ids(decoder_input_ids, self.config.vocab_size)
        return self.decoder(
            self.embedding(decoder_input_ids), attention_mask=decoder_attention_mask, cache=cache,
            encoder_hidden=encoder_output, encoder_mask=encoder_attention_mask,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
        )

    # ---- forward ---------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        cache: list[LayerCache] | None = None,
        encoder_output: Tensor | None = None,
        encoder_attention_mask: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_logits: bool = True,
        label_smoothing: float = 0.0,
    ) -> Seq2SeqOutput:
        """Training and scoring: ``input_ids`` the source (B, S) with ``attention_mask``; the target as
        ``decoder_input_ids`` (B, T), or as ``labels`` (B, T) that the decoder reads shifted right behind
        the start token (-100 in labels is ignored by the loss and read as padding). ``return_logits`` False
        (with labels): the loss only (``head_outputs``: no (B, T, V) logits held), ``logits`` None;
        ``label_smoothing``: the loss's.

        A generation step (the Session protocol): given ``encoder_output`` (B, S, D) and
        ``encoder_attention_mask``, ``input_ids`` are the decoder's tokens after the cached ones and
        ``attention_mask`` covers the cached ones too."""
        encoder_attentions = None
        generation_step = encoder_output is not None
        decoder_input_ids = self.decoder_tokens(input_ids, decoder_input_ids, labels, generation_step)
        if generation_step:
            decoder_attention_mask = attention_mask
        else:
            encoded = self.encode(input_ids, attention_mask, output_attentions)
            encoder_output, encoder_attention_mask = encoded.hidden, attention_mask
            encoder_attentions = encoded.attentions
        decoded = self.decode(decoder_input_ids, encoder_output, encoder_attention_mask, decoder_attention_mask, cache,
                              output_attentions, output_hidden_states)
        logits, loss = head_outputs(self, decoded.hidden, labels, return_logits, label_smoothing)
        return Seq2SeqOutput(
            logits=logits, loss=loss, attentions=decoded.attentions, hidden_states=decoded.hidden_states,
            cache=cache, encoder_output=encoder_output, cross_attentions=decoded.cross_attentions,
            encoder_attentions=encoder_attentions,
        )

    # ---- generation hooks (the Session protocol: tformer/generation/session.py) -------------------

    def encoded_source(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.encode(input_ids, attention_mask).hidden

    def new_cache(self, batch_size: int, max_len: int, dtype: torch.dtype | None = None,
                  device: torch.device | None = None) -> list[LayerCache]:
        """Self-attention caches for ``max_len`` decoder positions; the cross-attention ones are filled by the
        first step (the encoder's keys and values, projected once)."""
        return self.decoder.new_cache(batch_size, max_len, dtype or self.dtype, device or self.device)

    def cache_specs(self) -> list[LayerCacheSpec]:
        """The decoder's blocks: self-attention's cache, and the encoder's keys and values for cross-attention."""
        return self.decoder.cache_specs()

    def step(self, input_ids: Tensor, layout: StepLayout, cache: list[LayerCache], *, encoder_output: Tensor,
             encoder_attention_mask: Tensor | None = None) -> Tensor:
        """A decoding step: the decoder's tokens (B, T) after the cached ones, laid out by the caller,
        unchecked (a session checks its source once), attending to ``encoder_output`` (B, S, D) where
        ``encoder_attention_mask`` (B, S) is 1 (None: everywhere, a speech model's). Logits (B, kept rows, V)."""
        padding = None if encoder_attention_mask is None else encoder_attention_mask.bool()
        decoded = self.decoder.run(self.embedding(input_ids), layout, cache, encoder_output, padding)
        return self._logits(decoded.hidden)

    def _logits(self, hidden: Tensor) -> Tensor:
        """The decoder's last hidden states (B, T, D) -> logits (B, T, V) (T5 scales them first)."""
        if self.config.scale_decoder_output:
            hidden = hidden * self.config.d_model ** -0.5
        return self.lm_head(hidden)
