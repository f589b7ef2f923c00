"""Heads: what turns the stack's hidden states (B, T, D) into a task's outputs.

The task heads of the encoder and vision families are registered by name in ``HEADS``. Each declares the
modules it adds to a model (named as checkpoints and Hugging Face name them: ``classifier``, ``qa_head``,
...), the label arguments it reads, what it reads (every token, the pooled vector, or the pooled vector
through the model's tanh pooler), whether ``num_labels`` sizes it, and its forward with its loss. A family
computes its features (``forward_features``: hidden states and the pooled vector, ``pool``) and hands
them to its head (``forward_head``); the config, ``tformer.load(..., head=...)`` and the interop tables
read the same declarations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from tformer.choices import HEADS
from tformer.config import ConfigError, ModelConfig, require_positive_int
from tformer.nn.feedforward import activation_function
from tformer.nn.losses import IGNORE_INDEX, sequence_classification_loss, span_loss, token_cross_entropy
from tformer.nn.norm import build_norm


class LMHead(nn.Linear):
    """Hidden states (B, T, D) -> next-token logits (B, T, V): one projection, bias-free unless asked
    (Marian's ``final_logits_bias``), whose weight may be the token table itself (``tie_embeddings``)."""

    def __init__(self, d_model: int, vocab_size: int, bias: bool = False) -> None:
        super().__init__(d_model, vocab_size, bias=bias)


class MaskedLMHead(nn.Module):
    """BERT's masked-LM head: hidden states (B, T, D) -> token logits (B, T, V) through
    ``dense`` + activation + ``norm`` (the model's kind: BERT's LayerNorm), then ``decoder``
    (bias-free; its weight may be the token table, ``tie_embeddings``) plus a per-token ``bias``."""

    def __init__(self, d_model: int, vocab_size: int, activation: str, norm: nn.Module) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.activation = activation_function(activation)
        self.norm = norm
        self.decoder = nn.Linear(d_model, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (..., D) -> logits (..., V)."""
        return self.decoder(self.norm(self.activation(self.dense(hidden)))) + self.bias


class Pooler(nn.Module):
    """BERT's pooler: tanh(dense(vector)), (B, D) -> (B, D); the model picks the vector (the first
    token's, or a mean). With ``input_dropout`` > 0 the vector is dropped out first (RoBERTa's
    classification head)."""

    def __init__(self, d_model: int, input_dropout: float = 0.0) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(input_dropout) if input_dropout > 0 else nn.Identity()

    def forward(self, vector: Tensor) -> Tensor:
        return torch.tanh(self.dense(self.dropout(vector)))


POOLINGS = ("cls", "mean")  # the vector a pooled head reads: the first token's, or the mean of the tokens'


def pool(hidden: Tensor, pooling: str, attention_mask: Tensor | None = None, class_tokens: int = 0) -> Tensor:
    """(B, T, D) -> (B, D): the first token's vector (``"cls"``: BERT's [CLS], ViT's class token), the mean
    of the tokens after the first ``class_tokens`` (``"mean"``; ViT's patches: 1) that are not padding
    (``attention_mask`` (B, T), 1 = token), or the last token that is not padding (``"last"``: a decoder's, the
    only one that has read the whole text; padding on either side)."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        if attention_mask is None:
            return hidden[:, -1]
        positions = torch.arange(hidden.shape[1], device=hidden.device)  # (T,)
        last = (attention_mask.bool() * positions).argmax(dim=1)  # (B,) the last attended position
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    tokens = hidden[:, class_tokens:]
    if attention_mask is None:
        return tokens.mean(dim=1)
    weights = attention_mask[:, class_tokens:].to(hidden.dtype)[:, :, None]  # (B, T, 1)
    return (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


@dataclass
class Features:
    """What a family hands its head: the stack's output (B, T, D), the pooled vector (B, D) and, where the
    model has the tanh pooler, its output (B, D); the attention mask (B, T) when there is padding."""

    hidden: Tensor
    pooled: Tensor
    pooler_output: Tensor | None = None
    attention_mask: Tensor | None = None


class Head:
    """A task head: registered in ``HEADS`` under ``name`` for the ``families`` that may carry it.

    ``reads``: ``"tokens"`` (every position), ``"pooled"`` (the pooled vector) or ``"pooler"`` (the pooled
    vector through the model's tanh pooler, which the model then has); ``sized_by_labels``: ``num_labels``
    (and ``label_names``) size it; ``label_arguments``: the forward's label arguments it reads (any other
    given is refused); ``modules(config)``: what it adds to the model, by attribute name (``weights``: those
    with weights); ``forward(model, features, output, **labels)`` fills ``output`` (logits, loss, ...)."""

    name: ClassVar[str]
    families: ClassVar[tuple[str, ...]] = ("encoder",)
    reads: ClassVar[str] = "tokens"
    sized_by_labels: ClassVar[bool] = False
    label_arguments: ClassVar[tuple[str, ...]] = ("labels",)
    weights: ClassVar[tuple[str, ...]] = ()  # the names of ``modules`` that hold weights

    @classmethod
    def modules(cls, config: Any) -> dict[str, nn.Module]:
        raise NotImplementedError

    @classmethod
    def forward(cls, model: nn.Module, features: Features, output: Any, **labels: Tensor | None) -> None:
        raise NotImplementedError

    @classmethod
    def check_labels(cls, given: list[str]) -> None:
        """Refuse label arguments the head does not read."""
        unread = [name for name in given if name not in cls.label_arguments]
        if unread:
            raise ValueError(f"{', '.join(unread)} given, but head={cls.name!r} reads {', '.join(cls.label_arguments)}")


def check_labels(head: type[Head] | None, given: list[str]) -> None:
    """Refuse label arguments the model's head (None: the bare model, which reads none) does not read."""
    if head is not None:
        head.check_labels(given)
    elif given:
        raise ValueError(f"{', '.join(given)} given, but head=None reads none")


def add_head(model: nn.Module, config: Any) -> type[Head] | None:
    """Give ``model`` the modules of the head ``config.head`` names (its family's other head modules are
    None) and return the head (None: the bare model)."""
    head = HEADS[config.head] if config.head is not None else None
    modules = head.modules(config) if head is not None else {}
    for name in model.head_modules:
        if name != "pooler":
            setattr(model, name, None)
    for name, module in modules.items():
        setattr(model, name, module)
    return head


def _classifier(config: Any) -> dict[str, nn.Module]:
    """A Linear to ``num_labels`` logits, behind dropout at the model's rate (BERT's classifier dropout)."""
    dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
    return {"classifier": nn.Linear(config.d_model, config.num_labels), "classifier_dropout": dropout}


class MaskedLM(Head):
    """Token logits (B, T, V) from ``mlm_head``; the loss over the labelled positions (not -100). With
    ``labelled_logits_only`` the vocabulary projection runs only there: logits (N, V)."""

    name = "masked_lm"
    weights = ("mlm_head",)

    @classmethod
    def modules(cls, config: Any) -> dict[str, nn.Module]:
        norm = build_norm(config.norm, config.d_model, config.norm_eps, config.norm_bias)
        return {"mlm_head": MaskedLMHead(config.d_model, config.vocab_size, config.activation, norm)}

    @classmethod
    def forward(cls, model, features, output, labels=None, labelled_logits_only=False, **_) -> None:
        hidden = features.hidden
        if labelled_logits_only and labels is None:
            raise ValueError("labelled_logits_only needs labels (it computes logits where they are not -100)")
        # The loss reads only the labelled positions (about 15%): the softmax runs over those alone.
        labelled = None if labels is None else labels != IGNORE_INDEX
        if labelled_logits_only:
            output.logits = model.mlm_head(hidden[labelled])  # (N, V)
            output.loss = token_cross_entropy(output.logits, labels[labelled])
        else:
            output.logits = model.mlm_head(hidden)  # (B, T, V)
            if labels is not None:
                output.loss = token_cross_entropy(output.logits[labelled], labels[labelled])


class NextSentence(Head):
    """Is B the sentence after A? Two logits (B, 2) from ``nsp_head`` on the pooler's output."""

    name = "next_sentence"
    weights = ("nsp_head",)
    reads = "pooler"

    @classmethod
    def modules(cls, config: Any) -> dict[str, nn.Module]:
        return {"nsp_head": nn.Linear(config.d_model, 2)}

    @classmethod
    def forward(cls, model, features, output, labels=None, **_) -> None:
        output.logits = model.nsp_head(features.pooler_output)  # (B, 2)
        if labels is not None:
            output.loss = token_cross_entropy(output.logits, labels)


class Pretraining(Head):
    """BERT's pretraining: masked LM and next sentence together; the loss is their sum when both label
    kinds are given."""

    name = "pretraining"
    weights = ("mlm_head", "nsp_head")
    reads = "pooler"
    label_arguments = ("labels", "next_sentence_label")

    @classmethod
    def modules(cls, config: Any) -> dict[str, nn.Module]:
        return {**MaskedLM.modules(config), **NextSentence.modules(config)}

    @classmethod
    def forward(cls, model, features, output, labels=None, next_sentence_label=None, labelled_logits_only=False,
                **_) -> None:
        MaskedLM.forward(model, features, output, labels=labels, labelled_logits_only=labelled_logits_only)
        output.next_sentence_logits = model.nsp_head(features.pooler_output)  # (B, 2)
        if next_sentence_label is not None:
            nsp_loss = token_cross_entropy(output.next_sentence_logits, next_sentence_label)
            output.loss = nsp_loss if output.loss is None else output.loss + nsp_loss


class SequenceClassification(Head):
    """Logits (B, L) from dropout + ``classifier`` on the pooler's output; the loss by ``problem_type``."""

    name = "sequence_classification"
    weights = ("classifier",)
    reads = "pooler"
    sized_by_labels = True

    @classmethod
    def modules(cls, config: Any) -> dict[str, nn.Module]:
        return _classifier(config)

    @classmethod
    def forward(cls, model, features, output, labels=None, **_) -> None:
        output.logits = model.classifier(model.classifier_dropout(features.pooler_output))  # (B, L)
        if labels is not None:
            output.loss = sequence_classification_loss(output.logits, labels, model.config.problem_type)


class TokenClassification(Head):
    """Logits (B, T, L) from dropout + ``classifier`` on every token; labels -100 are ignored."""

    name = "token_classification"
    weights = ("classifier",)
    sized_by_labels = True

    @classmethod
    def modules(cls, config: Any) -> dict[str, nn.Module]:
        return _classifier(config)

    @classmethod
    def forward(cls, model, features, output, labels=None, **_) -> None:
        output.logits = model.classifier(model.classifier_dropout(features.hidden))  # (B, T, L)
        if labels is not None:
            output.loss = token_cross_entropy(output.logits, labels)


class QuestionAnswering(Head):
    """Start and end logits (B, T) from ``qa_head``; the loss's softmax runs over the real tokens
    (``span_loss`` with the attention mask)."""

    name = "question_answering"
    weights = ("qa_head",)
    label_arguments = ("start_positions", "end_positions")

    @classmethod
    def modules(cls, config: Any) -> dict[str, nn.Module]:
        return {"qa_head": nn.Linear(config.d_model, 2)}

    @classmethod
    def check_labels(cls, given: list[str]) -> None:
        super().check_labels(given)
        if len(given) == 1:
            raise ValueError("question answering needs both start_positions and end_positions, or neither")

    @classmethod
    def forward(cls, model, features, output, start_positions=None, end_positions=None, **_) -> None:
        output.logits = model.qa_head(features.hidden)  # (B, T, 2)
        output.start_logits, output.end_logits = output.logits.unbind(-1)
        if start_positions is not None and end_positions is not None:
            output.loss = span_loss(output.start_logits, output.end_logits, start_positions, end_positions,
                                    features.attention_mask)


class ImageClassification(Head):
    """Logits (B, L) from ``classifier`` on the pooled vector (Hugging Face's ViTForImageClassification:
    no tanh pooler, no dropout); the loss against class ids (-100: ignored)."""

    name = "image_classification"
    weights = ("classifier",)
    families = ("vision",)
    reads = "pooled"
    sized_by_labels = True

    @classmethod
    def modules(cls, config: Any) -> dict[str, nn.Module]:
        return {"classifier": nn.Linear(config.d_model, config.num_labels)}

    @classmethod
    def forward(cls, model, features, output, labels=None, **_) -> None:
        output.logits = model.classifier(features.pooled)  # (B, L)
        if labels is not None:
            output.loss = token_cross_entropy(output.logits, labels)


HEADS.register(MaskedLM, NextSentence, Pretraining, SequenceClassification, TokenClassification, QuestionAnswering,
               ImageClassification)
POOLED_HEADS = (None, *(name for name, head in HEADS.items() if head.reads == "pooler"))  # they read the pooler


def family_heads(family: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The heads a family may carry, and those of them that ``num_labels`` sizes."""
    heads = tuple(name for name, head in HEADS.items() if family in head.families)
    return heads, tuple(name for name in heads if HEADS[name].sized_by_labels)


def check_head_fields(config: ModelConfig) -> None:
    """The fields of a family with task heads (the encoder's, the vision family's): ``head`` one of the family's,
    ``num_labels`` and ``label_names`` as its head reads them, ``pooling`` one of ``POOLINGS``."""
    family = config.architecture
    heads, classification_heads = family_heads(family)
    if config.head is not None and config.head not in heads:
        raise ConfigError(f"head={config.head!r} is not one of None, {', '.join(heads)} (architecture={family!r})")
    check_label_fields(config, classification_heads)
    if config.pooling not in POOLINGS:
        raise ConfigError(f"pooling={config.pooling!r} is not one of {', '.join(POOLINGS)}")


def check_label_fields(config: ModelConfig, classification_heads: tuple[str, ...]) -> None:
    """``num_labels`` and ``label_names``: read only by the family's ``classification_heads``."""
    head = config.head
    require_positive_int("num_labels", config.num_labels)
    classifying = head in classification_heads
    if config.num_labels != 2 and not classifying:
        raise ConfigError(f"num_labels={config.num_labels} is read only by the classification heads "
                          f"({', '.join(classification_heads)}); head={head!r} has a fixed size")
    if config.label_names:
        if not classifying:
            raise ConfigError(f"label_names are read only by the classification heads, not head={head!r}")
        if not all(isinstance(name, str) and name for name in config.label_names):
            raise ConfigError(f"label_names={list(config.label_names)!r} must be non-empty strings")
        if len(config.label_names) != config.num_labels or len(set(config.label_names)) != config.num_labels:
            raise ConfigError(f"label_names={list(config.label_names)!r} must be {config.num_labels} distinct "
                              f"names (num_labels={config.num_labels})")


def replace_head(
    config: ModelConfig, head: str | None, num_labels: int | None = None, label_names: tuple[str, ...] | None = None,
    problem_type: str | None = None, pooling: str | None = None, **layout: Any,
) -> ModelConfig:
    """``config`` with a new head (an encoder's or a vision model's), for fine-tuning: what the old
    head's fields said is kept only where it still applies (the same head and number of labels);
    ``num_labels`` defaults to the number of ``label_names``, else 2; ``pooling`` to the config's where
    the new head reads a pooled vector, else ``"cls"``. ``layout``: fields a family fixes for the head."""
    if label_names is not None:
        label_names = tuple(label_names)
        num_labels = len(label_names) if num_labels is None else num_labels
    same_head = head == config.head
    if num_labels is None:
        num_labels = config.num_labels if same_head else 2
    if label_names is None:
        label_names = config.label_names if same_head and num_labels == config.num_labels else ()
    if problem_type is None and same_head:
        problem_type = config.problem_type
    pooler_input_dropout = config.pooler_input_dropout and head in POOLED_HEADS
    if pooling is None:
        pooling = config.pooling if head is None or HEADS[head].reads != "tokens" else "cls"
    return config.replace(**{
        "head": head, "num_labels": num_labels, "label_names": label_names, "problem_type": problem_type,
        "pooler_input_dropout": pooler_input_dropout, "pooling": pooling, **layout,
    })


def head_module_names(family: str) -> tuple[str, ...]:
    """The pooler and every module with weights a head of ``family`` may add: what ``tformer.load(...,
    head=...)`` drops or makes afresh."""
    names = ["pooler"]
    for head in HEADS.values():
        if family in head.families:
            names += [name for name in head.weights if name not in names]
    return tuple(names)
