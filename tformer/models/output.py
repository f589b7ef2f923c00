"""The result of a model's forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class ModelOutput:
    """``logits`` (None from a model asked for its loss alone: ``return_logits=False``); ``loss`` when labels
    were given; per-layer ``attentions`` (B, H, Tq, Tk) and ``hidden_states`` (B, T, D) when asked for; ``cache``
    when decoding."""

    logits: Tensor | None
    loss: Tensor | None = None
    attentions: list[Tensor] | None = None
    hidden_states: list[Tensor] | None = None
    cache: object | None = None


@dataclass
class GenerationState:
    """What ``prepare_generation`` returns: where the decoder starts, and what each step needs."""

    input_ids: Tensor  # (B, T0) the decoder's prompt: a decoder's own, an encoder–decoder's start tokens
    attention_mask: Tensor | None = None  # (B, T0) 1 = token, 0 = left padding; None: no padding
    # Keyword arguments of every forward step, each indexed by row (B, ...), reordered with the rows:
    # e.g. encoder_output (B, S, D) and encoder_attention_mask (B, S).
    step_inputs: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class EncoderOutput(ModelOutput):
    """An encoder's result. ``logits`` by head: masked LM and pretraining (B, T, V); next sentence (B, 2);
    sequence classification (B, num_labels); token classification (B, T, num_labels); question
    answering (B, T, 2), start then end, also given as ``start_logits`` and ``end_logits`` (B, T);
    the bare encoder (head None): its last hidden states (B, T, D). ``next_sentence_logits`` (B, 2)
    with the pretraining head; ``pooled`` (B, D) the pooler's output where the model has one."""

    last_hidden_state: Tensor | None = None
    pooled: Tensor | None = None
    next_sentence_logits: Tensor | None = None
    start_logits: Tensor | None = None
    end_logits: Tensor | None = None


@dataclass
class VisionOutput(ModelOutput):
    """A vision model's result. ``logits``: (B, num_labels) with the image-classification head; for the
    bare model (head None), its last hidden states (B, 1 + N, D), the class token first. ``last_hidden_state``
    (B, 1 + N, D) after the final norm; ``pooled`` (B, D) the pooler's output where the model has one."""

    last_hidden_state: Tensor | None = None
    pooled: Tensor | None = None


@dataclass
class Seq2SeqOutput(ModelOutput):
    """``logits`` (B, T, V) of the decoder's tokens (None with ``return_logits=False``); ``loss`` against
    ``labels``; the encoder's output
    (B, S, D) and, when asked for, the decoder's per-layer cross-attention weights (B, H, T, S); a speech
    model with a CTC head gives its ``ctc_logits`` (B, S, V) over the encoder's positions."""

    encoder_output: Tensor | None = None
    cross_attentions: list[Tensor] | None = None
    encoder_attentions: list[Tensor] | None = None
    ctc_logits: Tensor | None = None
