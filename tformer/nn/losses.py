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
