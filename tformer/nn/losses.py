"""Token-level losses."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from tformer.nn.inputs import warn_if_no_targets

IGNORE_INDEX = -100


def token_cross_entropy(logits: Tensor, targets: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of logits (..., V) against targets (...); IGNORE_INDEX is skipped.
    Computed in float32 whatever the logits' dtype; NaN, with a warning, when every target is ignored."""
    warn_if_no_targets(targets, IGNORE_INDEX)
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
        ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing,
    )


def next_token_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Loss of predicting labels[:, t + 1] from logits[:, t] (labels aligned with the inputs).

    Shifting the labels, not the logits, avoids copying the (B, T, V) logits.
    """
    shifted = labels.new_full(labels.shape, IGNORE_INDEX)
    shifted[:, :-1] = labels[:, 1:]
    return token_cross_entropy(logits, shifted)


def sequence_classification_loss(logits: Tensor, labels: Tensor, problem_type: str | None) -> Tensor:
    """Loss of logits (B, L) against ``labels`` as Hugging Face's ``problem_type`` says: regression
    (mean squared error; labels (B,) for one output, else (B, L)), single-label classification
    (cross-entropy against class ids (B,)), multi-label classification (binary cross-entropy with
    logits against (B, L) targets in [0, 1]). None infers it as HF does: regression for one output,
    single-label for integer labels, multi-label otherwise."""
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
            return F.mse_loss(logits.squeeze(-1).float(), labels.reshape(-1).float())
        return F.mse_loss(logits.float(), labels.float())
    if problem_type == "single_label_classification":
        return token_cross_entropy(logits, labels)
    if problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    raise ValueError(f"problem_type={problem_type!r} is not one of single_label_classification, "
                     "multi_label_classification, regression")


def span_loss(start_logits: Tensor, end_logits: Tensor, start_positions: Tensor, end_positions: Tensor) -> Tensor:
    """Extractive question answering: the mean of the start and end cross-entropies over logits (B, T).

    Positions (B,) outside the sequence are clamped to T and ignored, as Hugging Face does (a window
    whose answer was cut off); a batch where every position is ignored gives NaN, as HF's does."""
    length = start_logits.shape[-1]
    start_positions = start_positions.reshape(-1).clamp(0, length)
    end_positions = end_positions.reshape(-1).clamp(0, length)
    start = F.cross_entropy(start_logits.float(), start_positions, ignore_index=length)
    end = F.cross_entropy(end_logits.float(), end_positions, ignore_index=length)
    return (start + end) / 2
