"""EncoderModel: BERT / RoBERTa on the shared core, with a pooler and one task head.

Encoder fields: ``head`` (an encoder head of ``nn.heads.HEADS``, None for the bare encoder); ``num_labels``
and ``label_names`` (names by label id; empty: ``LABEL_0``, ...) for the classification heads;
``problem_type`` the loss of sequence classification (``models.encoder.PROBLEM_TYPES``; None: regression for
one label, cross-entropy for integer labels, binary cross-entropy per label for float labels);
``position_offset`` > 0 numbers positions as RoBERTa: tokens other than ``pad_token_id`` from
``position_offset`` on, padding tokens at ``position_offset - 1``; ``pooler_input_dropout``
applies dropout to the first token's vector before the pooler (RoBERTa's classification head);
``pooling`` the vector the pooler reads (``POOLINGS``: the first token's, BERT's, or the mean of
the tokens that are not padding; Hugging Face's classes have the first only).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tformer.config import TOKEN_FIELDS, TOKEN_POSITION_FIELDS, ConfigError, ModelConfig
from tformer.models.base import Model
from tformer.models.output import EncoderOutput
from tformer.models.registry import register
from tformer.nn.embeddings import TokenEmbedding
from tformer.nn.heads import (
    POOLED_HEADS,
    Features,
    Pooler,
    add_head,
    check_head_fields,
    check_labels,
    head_module_names,
    pool,
)
from tformer.nn.inputs import check_attention_mask, check_token_ids
from tformer.nn.positions import POSITIONAL_SCHEMES
from tformer.nn.stack import TransformerStack

# The loss of sequence classification, named as Hugging Face's ``problem_type`` (None: inferred as HF does).
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")
ENCODER_FIELDS = ("type_vocab_size", "head", "num_labels", "problem_type", "label_names", "position_offset",
                  "pooler_input_dropout", "pooling")


def check_encoder_config(config: ModelConfig) -> None:
    """An encoder's head, labels, loss, RoBERTa's position numbering and pooling."""
    head = config.head
    check_head_fields(config)
    if config.problem_type is not None:
        if config.problem_type not in PROBLEM_TYPES:
            raise ConfigError(f"problem_type={config.problem_type!r} is not one of None, {', '.join(PROBLEM_TYPES)}")
        if head != "sequence_classification":
            raise ConfigError(f"problem_type={config.problem_type!r} is read only by "
                              f"head='sequence_classification', not head={head!r}")
    offset = config.position_offset
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < config.max_seq_len:
        raise ConfigError(f"position_offset={offset!r} must be an integer in [0, max_seq_len={config.max_seq_len})")
    if offset and (config.pad_token_id is None or not POSITIONAL_SCHEMES[config.positional].table):
        tables = " or ".join(repr(name) for name, scheme in POSITIONAL_SCHEMES.items() if scheme.table)
        raise ConfigError(f"position_offset={offset} needs pad_token_id (what counts as padding) and a "
                          f"position table (positional={tables})")
    if config.pooling != "cls" and head not in POOLED_HEADS:
        raise ConfigError(f"pooling={config.pooling!r} needs a head that reads the pooler "
                          f"({', '.join(map(repr, POOLED_HEADS))}), not head={head!r}")
    if config.pooler_input_dropout and head not in POOLED_HEADS:
        raise ConfigError(f"pooler_input_dropout=True needs a head that reads the pooler "
                          f"({', '.join(map(repr, POOLED_HEADS))}), not head={head!r}")


def _bert(d_model: int, num_layers: int, num_heads: int) -> dict[str, Any]:
    """A BERT-shaped encoder (the uncased English WordPiece vocabulary's size, [PAD] = 0)."""
    return dict(
        vocab_size=30522, max_seq_len=512, d_model=d_model, num_layers=num_layers, num_heads=num_heads,
        activation="gelu", norm="layernorm", norm_position="post", norm_eps=1e-12, positional="learned",
        embedding_norm=True, type_vocab_size=2, dropout=0.1, attention_dropout=0.1, pad_token_id=0,
    )


# BERT (Devlin et al. 2019): post-norm, exact GELU, segment embeddings, embedding LayerNorm.
# bert-base is Hugging Face's BertModel bert-base-uncased: 109,482,240 parameters with the pooler.
ENCODER_PRESETS = {
    "bert-base": _bert(768, 12, 12),
    "bert-small": _bert(512, 4, 8),
    "bert-mini": _bert(256, 4, 4),
    "bert-tiny": _bert(128, 2, 2),
}


@register("encoder", fields=(*TOKEN_FIELDS, *TOKEN_POSITION_FIELDS, *ENCODER_FIELDS), check=check_encoder_config,
          presets=ENCODER_PRESETS)
class EncoderModel(Model):
    """Token (+ segment) embedding -> bidirectional TransformerStack (learned positions, embedding
    norm, post-norm blocks as BERT) -> the tanh pooler where the head reads it, on the first token
    ([CLS]) or with ``config.pooling="mean"`` the mean of the tokens -> the head named by ``config.head``:

    - ``masked_lm``: ``mlm_head`` (dense, activation, norm, decoder tied to the token table, bias)
    - ``next_sentence``: ``nsp_head`` (2 classes) on the pooled output
    - ``pretraining``: both; the loss is their sum when both label kinds are given
    - ``sequence_classification``: dropout + ``classifier`` on the pooled output
    - ``token_classification``: dropout + ``classifier`` on every token (label -100: ignored)
    - ``question_answering``: ``qa_head`` gives start and end logits per token
    - None: the bare encoder (hidden states and pooled output)

    Positions are indices 0..T-1 (BERT), or with ``position_offset`` RoBERTa's numbering of the
    tokens that are not padding. An encoder has no generation hooks: ``tformer.generate`` refuses it.
    """

    head_modules = head_module_names("encoder")
    scaled_residual_init = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.embedding = TokenEmbedding.from_config(config)
        self.stack = TransformerStack(config, causal=False)
        self.pooler = Pooler(config.d_model, config.dropout if config.pooler_input_dropout else 0.0) \
            if config.has_pooler else None
        self.task_head = add_head(self, config)
        self.init_weights()
        if self.mlm_head is not None and config.tie_embeddings:
            self.mlm_head.decoder.weight = self.embedding.token.weight

    def tied_parameters(self) -> dict[str, str]:
        if self.mlm_head is not None and self.config.tie_embeddings:
            return {"mlm_head.decoder.weight": "embedding.token.weight"}
        return {}

    def position_ids(self, input_ids: Tensor) -> Tensor:
        """(B, T) positions: 0..T-1 (BERT); with ``position_offset``, RoBERTa's: tokens other than
        ``pad_token_id`` numbered from the offset on, padding at ``position_offset - 1``."""
        offset = self.config.position_offset
        if not offset:
            return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        real = input_ids != self.config.pad_token_id
        return (real.cumsum(-1) * real) + (offset - 1)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        next_sentence_label: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        labelled_logits_only: bool = False,
    ) -> EncoderOutput:
        """input_ids (B, T); ``attention_mask`` (B, T), 1 = attend; ``token_type_ids`` (B, T) segments.

        Labels, by head (Hugging Face's names and conventions): ``labels`` (B, T) token ids for masked
        LM (-100 where not masked) and tags for token classification (-100: ignored), (B,) classes or
        (B, L) targets for sequence classification, (B,) for next sentence (0: B follows A);
        ``next_sentence_label`` (B,) with the pretraining head; ``start_positions`` and ``end_positions``
        (B,) token indices for question answering (outside the sequence or on padding: ignored; the loss's
        softmax runs over the real tokens, ``span_loss``).

        ``labelled_logits_only`` (masked LM, pretraining; needs ``labels``): the vocabulary projection
        runs only at positions whose label is not -100, and ``logits`` is (N, V) for those N positions
        in row-major order. The same loss and gradients for about 1/7 of the head's work at BERT's
        15% masking: the pretraining step's shortcut.
        """
        labels_given = {"labels": labels, "next_sentence_label": next_sentence_label,
                        "start_positions": start_positions, "end_positions": end_positions}
        labels_given = {name: value for name, value in labels_given.items() if value is not None}
        check_labels(self.task_head, list(labels_given))
        if labelled_logits_only and self.mlm_head is None:
            raise ValueError(f"labelled_logits_only is for the masked-LM heads, not head={self.config.head!r}")
        features, output = self.forward_features(input_ids, attention_mask, token_type_ids, position_ids,
                                                 output_attentions, output_hidden_states)
        if self.task_head is not None:
            self.task_head.forward(self, features, output, labelled_logits_only=labelled_logits_only,
                                   **labels_given)
        return output

    def forward_features(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None, output_attentions: bool = False, output_hidden_states: bool = False,
    ) -> tuple[Features, EncoderOutput]:
        """The encoder without its head: the features a head reads, and the output of the bare encoder
        (``logits`` its hidden states (B, T, D), ``pooled`` the pooler's output where it has one)."""
        check_token_ids(input_ids, self.config.vocab_size)
        if attention_mask is not None:
            check_attention_mask(attention_mask, tuple(input_ids.shape))
        if attention_mask is not None and not torch.compiler.is_compiling() and bool(attention_mask.all()):
            attention_mask = None  # no padding (packed pretraining batches): the fused kernel needs no mask
        if position_ids is None:
            position_ids = self.position_ids(input_ids)
        stack = self.stack(
            self.embedding(input_ids, token_type_ids), attention_mask=attention_mask, position_ids=position_ids,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
        )
        hidden = stack.hidden  # (B, T, D)
        pooled = pool(hidden, self.config.pooling, attention_mask)  # (B, D)
        pooler_output = self.pooler(pooled) if self.pooler is not None else None  # (B, D)
        output = EncoderOutput(
            logits=hidden, attentions=stack.attentions, hidden_states=stack.hidden_states,
            last_hidden_state=hidden, pooled=pooler_output,
        )
        return Features(hidden, pooled, pooler_output, attention_mask), output
