"""Learning-rate schedules as pure functions of the step, so a resumed run needs no scheduler state."""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "linear", "constant", "inverse_sqrt")


def learning_rate(
    step: int,
    *,
    schedule: str,
    lr: float,
    warmup_steps: int,
    max_steps: int,
    min_lr: float = 0.0,
    d_model: int | None = None,
) -> float:
    """The learning rate at ``step`` (0-based).

    cosine / linear: linear warmup from 0 to ``lr`` over ``warmup_steps``, then decay to
    ``min_lr`` at ``max_steps``. constant: warmup then ``lr``. inverse_sqrt: the 2017 paper's
    ``lr * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)`` with s = step + 1 (``lr`` is a multiplier).
    """
    if schedule == "inverse_sqrt":
        if d_model is None:
            raise ValueError("the inverse_sqrt schedule needs d_model")
        s = step + 1
        return lr * d_model**-0.5 * min(s**-0.5, s * max(warmup_steps, 1) ** -1.5)
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    if schedule == "cosine":
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
    if schedule == "linear":
        return lr + progress * (min_lr - lr)
    raise ValueError(f"schedule={schedule!r} is not one of {', '.join(SCHEDULES)}")
