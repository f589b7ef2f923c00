"""The losses, in one place: the models compute their ``loss`` with these functions and the training
tasks train and evaluate with them, so ``model(**batch).loss`` is the loss a task trains on.

Every function takes ``reduction``: ``"mean"`` (the training loss, Hugging Face's), ``"sum"`` and
``"none"`` (per target or per example, for an evaluation that adds losses up over batches, or weighs
rows); ``sum / count`` of the summed loss is the mean. All compute in float32 whatever the logits' dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from tformer.nn.inputs import warn_if_no_targets

IGNORE_INDEX = -100
Reduction = Literal["mean", "sum", "none"]
REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not one of {', '.join(REDUCTIONS)}")


def token_cross_entropy(logits: Tensor, targets: Tensor, label_smoothing: float = 0.0,
                        reduction: Reduction = "mean") -> Tensor:
    """Cross-entropy of logits (..., V) against targets (...); IGNORE_INDEX is skipped.

    ``"mean"``: over the targets not ignored (NaN, with a warning, when every one is); ``"sum"``: their
    sum; ``"none"``: one loss per target, shaped like ``targets`` (0 where ignored)."""
    _check_reduction(reduction)
    if reduction == "mean":
        warn_if_no_targets(targets, IGNORE_INDEX)
    losses = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
        ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing, reduction=reduction,
    )
    return losses.reshape(targets.shape) if reduction == "none" else losses


def next_token_targets(labels: Tensor, length: int) -> Tensor:
    """The token each of ``length`` positions predicts: ``labels`` (B, T) aligned with the inputs give
    labels[:, t + 1] (the last position predicts nothing: -100); (B, T + 1), the inputs followed by the
    token after them (a language-model crop), give every position its next token."""
    if labels.shape[-1] == length + 1:
        return labels[:, 1:]
    if labels.shape[-1] != length:
        raise ValueError(f"labels hold {labels.shape[-1]} positions for {length} inputs: give {length} (aligned "
                         f"with the inputs) or {length + 1} (the inputs and the token after them)")
    shifted = labels.new_full(labels.shape, IGNORE_INDEX)
    shifted[:, :-1] = labels[:, 1:]
    return shifted


def next_token_loss(logits: Tensor, labels: Tensor, label_smoothing: float = 0.0,
                    reduction: Reduction = "mean") -> Tensor:
    """Loss of predicting the next token from logits (B, T, V); ``labels`` as ``next_token_targets`` reads them.

    Shifting the labels, not the logits, avoids copying the (B, T, V) logits.
    """
    return token_cross_entropy(logits, next_token_targets(labels, logits.shape[1]), label_smoothing, reduction)


def _per_example(loss: Callable[..., Tensor], predictions: Tensor, targets: Tensor, reduction: str) -> Tensor:
    """An elementwise loss reduced as ``reduction`` says, an example being a row: ``"none"`` gives (B,), the
    mean over a row's outputs; ``"sum"`` adds those; ``"mean"`` is the mean over every element."""
    if reduction == "mean":
        return loss(predictions, targets)
    losses = loss(predictions, targets, reduction="none")
    if losses.dim() > 1:
        losses = losses.mean(dim=-1)  # (B, L) -> (B,)
    return losses if reduction == "none" else losses.sum()


def sequence_classification_loss(logits: Tensor, labels: Tensor, problem_type: str | None,
                                 reduction: Reduction = "mean") -> Tensor:
    """Loss of logits (B, L) against ``labels`` as Hugging Face's ``problem_type`` says: regression
    (mean squared error; labels (B,) for one output, else (B, L)), single-label classification
    (cross-entropy against class ids (B,)), multi-label classification (binary cross-entropy with
    logits against (B, L) targets in [0, 1]). None infers it as HF does: regression for one output,
    single-label for integer labels, multi-label otherwise. ``"none"``: one loss per example (B,)."""
    _check_reduction(reduction)
    num_labels = logits.shape[-1]
    if problem_type is None:
        if num_labels == 1:
            problem_type = "regression"
        elif not labels.is_floating_point():
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        if num_labels == 1:
            return _per_example(F.mse_loss, logits.squeeze(-1).float(), labels.reshape(-1).float(), reduction)
        return _per_example(F.mse_loss, logits.float(), labels.float(), reduction)
    if problem_type == "single_label_classification":
        return token_cross_entropy(logits, labels, reduction=reduction)
    if problem_type == "multi_label_classification":
        return _per_example(F.binary_cross_entropy_with_logits, logits.float(), labels.float(), reduction)
    raise ValueError(f"problem_type={problem_type!r} is not one of single_label_classification, "
                     "multi_label_classification, regression")


def span_loss(start_logits: Tensor, end_logits: Tensor, start_positions: Tensor, end_positions: Tensor,
              attention_mask: Tensor | None = None, reduction: Reduction = "mean") -> Tensor:
    """Extractive question answering: the mean of the start and end cross-entropies over logits (B, T).

    With ``attention_mask`` (B, T) (1 = a real token) the softmax runs over each row's own tokens, so a
    row's loss does not depend on how much its batch is padded; without it, over all T positions, as
    Hugging Face's loss does. Positions (B,) outside the sequence (at T or beyond, or on padding) are
    ignored, as HF ignores positions past the end (a window whose answer was cut off); a batch where
    every position is ignored gives NaN, as HF's does. ``"none"``: each row's (start + end) / 2 (B,),
    an ignored position counting 0; ``"sum"``: their sum."""
    _check_reduction(reduction)
    length = start_logits.shape[-1]
    start_logits, end_logits = start_logits.float(), end_logits.float()  # (B, T)
    start_positions = start_positions.reshape(-1).clamp(0, length)
    end_positions = end_positions.reshape(-1).clamp(0, length)
    if attention_mask is not None:
        padding = attention_mask == 0  # (B, T)
        start_logits = start_logits.masked_fill(padding, -math.inf)
        end_logits = end_logits.masked_fill(padding, -math.inf)
        outside = torch.cat([padding, padding.new_ones(padding.shape[0], 1)], dim=1)  # (B, T + 1): T is outside
        start_positions = start_positions.masked_fill(outside.gather(1, start_positions[:, None])[:, 0], length)
        end_positions = end_positions.masked_fill(outside.gather(1, end_positions[:, None])[:, 0], length)
    each = "none" if reduction == "sum" else reduction
    start = F.cross_entropy(start_logits, start_positions, ignore_index=length, reduction=each)
    end = F.cross_entropy(end_logits, end_positions, ignore_index=length, reduction=each)
    losses = (start + end) / 2
    return losses.sum() if reduction == "sum" else losses


def ctc_frames_needed(targets: Tensor) -> Tensor:
    """The fewest frames a CTC alignment of each row of targets (B, T) (IGNORE_INDEX past its end) needs: one
    a token, and a blank between two equal neighbours. (B,)"""
    real = targets != IGNORE_INDEX
    repeats = (targets[:, 1:] == targets[:, :-1]) & real[:, 1:]
    return real.sum(dim=1) + repeats.sum(dim=1)


def ctc_loss(logits: Tensor, targets: Tensor, blank: int, reduction: Reduction = "mean") -> Tensor:
    """Connectionist temporal classification (Graves et al. 2006): the negative log-probability, under frame
    logits (B, S, C), of every path over the S frames that reads as a row of targets (B, T) once repeats are
    merged and ``blank`` dropped. Every row reads all S frames; targets end at their first IGNORE_INDEX.

    ``"none"``: each row's loss over its target count (B,) (an empty row: its loss); ``"mean"``: their mean
    (PyTorch's and ESPnet's convention); ``"sum"``: their sum. A row that cannot align (fewer frames than
    ``ctc_frames_needed``) is a ValueError, not an infinite loss."""
    _check_reduction(reduction)
    frames = logits.shape[1]
    needed = ctc_frames_needed(targets)  # (B,)
    if bool((needed > frames).any()):
        raise ValueError(f"a CTC target needs {int(needed.max())} frames (a token each, a blank between repeats); "
                         f"the logits have {frames}")
    lengths = (targets != IGNORE_INDEX).sum(dim=1)  # (B,)
    log_probs = F.log_softmax(logits.float(), dim=-1).transpose(0, 1)  # (S, B, C)
    losses = F.ctc_loss(log_probs, targets.clamp(min=0), torch.full_like(lengths, frames), lengths, blank=blank,
                        reduction="none") / lengths.clamp(min=1)  # (B,)
    return losses if reduction == "none" else losses.sum() if reduction == "sum" else losses.mean()
