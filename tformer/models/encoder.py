"""EncoderModel: BERT / RoBERTa on the shared core, with a pooler and one task head."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tformer.config import CLASSIFICATION_HEADS, ModelConfig
from tformer.models.base import Model
from tformer.models.output import EncoderOutput
from tformer.models.registry import register
from tformer.nn.embeddings import TokenEmbedding
from tformer.nn.heads import MaskedLMHead, Pooler
from tformer.nn.inputs import check_attention_mask, check_token_ids
from tformer.nn.losses import IGNORE_INDEX, sequence_classification_loss, span_loss, token_cross_entropy
from tformer.nn.norm import build_norm
from tformer.nn.stack import TransformerStack

HEAD_MODULES = ("pooler", "mlm_head", "nsp_head", "classifier", "qa_head")
# The label arguments each head reads; any other given is refused rather than ignored.
HEAD_LABELS = {
    None: (),
    "masked_lm": ("labels",),
    "next_sentence": ("labels",),
    "pretraining": ("labels", "next_sentence_label"),
    "sequence_classification": ("labels",),
    "token_classification": ("labels",),
    "question_answering": ("start_positions", "end_positions"),
}


@register("encoder")
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

    head_modules = HEAD_MODULES
    scaled_residual_init = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        head, d_model = config.head, config.d_model
        self.embedding = TokenEmbedding.from_config(config)
        self.stack = TransformerStack(config, causal=False)
        self.pooler = Pooler(d_model, config.dropout if config.pooler_input_dropout else 0.0) \
            if config.has_pooler else None
        self.mlm_head = MaskedLMHead(
            d_model, config.vocab_size, config.activation,
            build_norm(config.norm, d_model, config.norm_eps, config.norm_bias),
        ) if head in ("masked_lm", "pretraining") else None
        self.nsp_head = nn.Linear(d_model, 2) if head in ("next_sentence", "pretraining") else None
        classifying = head in CLASSIFICATION_HEADS
        self.classifier = nn.Linear(d_model, config.num_labels) if classifying else None
        self.classifier_dropout = nn.Dropout(config.dropout) if classifying and config.dropout > 0 else nn.Identity()
        self.qa_head = nn.Linear(d_model, 2) if head == "question_answering" else None
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
        check_token_ids(input_ids, self.config.vocab_size)
        given = {"labels": labels, "next_sentence_label": next_sentence_label, "start_positions": start_positions,
                 "end_positions": end_positions}
        _check_label_arguments(self.config.head, [name for name, value in given.items() if value is not None])
        if labelled_logits_only and self.mlm_head is None:
            raise ValueError(f"labelled_logits_only is for the masked-LM heads, not head={self.config.head!r}")
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
        pooled = self.pooler(self._pooler_input(hidden, attention_mask)) if self.pooler is not None else None  # (B, D)
        output = EncoderOutput(
            logits=hidden, attentions=stack.attentions, hidden_states=stack.hidden_states,
            last_hidden_state=hidden, pooled=pooled,
        )
        head = self.config.head
        if head in ("masked_lm", "pretraining"):
            if labelled_logits_only and labels is None:
                raise ValueError("labelled_logits_only needs labels (it computes logits where they are not -100)")
            # The loss reads only the labelled positions (about 15%): the softmax runs over those alone.
            labelled = None if labels is None else labels != IGNORE_INDEX
            if labelled_logits_only:
                output.logits = self.mlm_head(hidden[labelled])  # (N, V)
                output.loss = token_cross_entropy(output.logits, labels[labelled])
            else:
                output.logits = self.mlm_head(hidden)  # (B, T, V)
                if labels is not None:
                    output.loss = token_cross_entropy(output.logits[labelled], labels[labelled])
            if head == "pretraining":
                output.next_sentence_logits = self.nsp_head(pooled)  # (B, 2)
                if next_sentence_label is not None:
                    nsp_loss = token_cross_entropy(output.next_sentence_logits, next_sentence_label)
                    output.loss = nsp_loss if output.loss is None else output.loss + nsp_loss
        elif head == "next_sentence":
            output.logits = self.nsp_head(pooled)
            if labels is not None:
                output.loss = token_cross_entropy(output.logits, labels)
        elif head == "sequence_classification":
            output.logits = self.classifier(self.classifier_dropout(pooled))  # (B, L)
            if labels is not None:
                output.loss = sequence_classification_loss(output.logits, labels, self.config.problem_type)
        elif head == "token_classification":
            output.logits = self.classifier(self.classifier_dropout(hidden))  # (B, T, L)
            if labels is not None:
                output.loss = token_cross_entropy(output.logits, labels)
        elif head == "question_answering":
            output.logits = self.qa_head(hidden)  # (B, T, 2)
            output.start_logits, output.end_logits = output.logits.unbind(-1)
            if start_positions is not None and end_positions is not None:
                output.loss = span_loss(output.start_logits, output.end_logits, start_positions, end_positions,
                                        attention_mask)
        return output

    def _pooler_input(self, hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
        """(B, T, D) -> (B, D): the first token's vector ([CLS], ``pooling="cls"``, BERT's), or the mean
        of the tokens that are not padding (``pooling="mean"``)."""
        if self.config.pooling == "cls":
            return hidden[:, 0]
        if attention_mask is None:
            return hidden.mean(dim=1)
        weights = attention_mask.to(hidden.dtype)[:, :, None]  # (B, T, 1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def _check_label_arguments(head: str | None, given: list[str]) -> None:
    """Refuse label arguments the head does not read; question answering needs both positions or neither."""
    unread = [name for name in given if name not in HEAD_LABELS[head]]
    if unread:
        reads = ", ".join(HEAD_LABELS[head]) or "none"
        raise ValueError(f"{', '.join(unread)} given, but head={head!r} reads {reads}")
    if head == "question_answering" and len(given) == 1:
        raise ValueError("question answering needs both start_positions and end_positions, or neither")
